"""Networks: the segmentation U-Net and the FedSM model selector."""

from fedsm_core.models.segmentation import build_segmentation_model
from fedsm_core.models.selector import Selector
from fedsm_core.models.spec import ModelSpec
from fedsm_core.models.weights import get_weights, set_weights

__all__ = ["ModelSpec", "Selector", "build_segmentation_model", "get_weights", "set_weights"]
