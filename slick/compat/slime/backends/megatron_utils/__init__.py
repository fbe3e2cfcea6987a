"""slime's ``slime.backends.megatron_utils`` names that loss plug-ins import (only ``cp_utils``)."""
