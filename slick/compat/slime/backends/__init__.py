"""slime's ``slime.backends`` names that loss plug-ins import (only ``megatron_utils.cp_utils``)."""
