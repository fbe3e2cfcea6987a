"""``params(**flags)``: the typed algorithm settings of a default Config with ``flags`` set (tests only)."""
from slick.algo import AlgoParams
from slick.config import Config


def params(**flags) -> AlgoParams:
    """``AlgoParams`` of ``Config.from_flat(flags)``: the defaults are config/groups.py's, as in a run."""
    return AlgoParams.from_config(Config.from_flat(flags))
