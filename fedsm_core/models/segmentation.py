"""The segmentation network shared by the global and the personalized models."""

from __future__ import annotations

import segmentation_models_pytorch as smp
import torch.nn as nn

DEFAULT_DECODER_CHANNELS = (128, 64, 32, 16, 8)


def build_segmentation_model(
    encoder: str,
    num_structures: int,
    in_channels: int = 3,
    decoder_channels: tuple[int, ...] = DEFAULT_DECODER_CHANNELS,
) -> nn.Module:
    """Build a U-Net (Ronneberger et al. 2015) with one output channel per structure.

    The encoder comes from segmentation-models-pytorch and starts from random
    weights (``encoder_weights=None``): nothing is downloaded, which a hospital
    node without internet requires.

    Parameters
    ----------
    encoder : str
        An smp encoder name, e.g. ``"mobilenet_v2"`` (4.1 M parameters with the
        default decoder, fast on CPU) or ``"resnet18"``.
    num_structures : int
        Output channels: 2 for fundus (optic disc, optic cup), 1 for prostate.
    in_channels : int
        Input image channels.
    decoder_channels : tuple of int
        Width of each of the five decoder stages.

    Returns
    -------
    torch.nn.Module
        Maps ``[B, in_channels, H, W]`` to logits ``[B, num_structures, H, W]``;
        ``H`` and ``W`` must be multiples of 32.
    """
    if num_structures < 1:
        raise ValueError(f"num_structures must be >= 1, got {num_structures}")
    try:
        return smp.Unet(
            encoder_name=encoder,
            encoder_weights=None,
            in_channels=in_channels,
            classes=num_structures,
            decoder_channels=decoder_channels,
        )
    except (KeyError, ValueError) as error:
        raise ValueError(
            f"encoder = '{encoder}' is not an encoder segmentation-models-pytorch knows ({error}); "
            "set `encoder` in [tool.flwr.app.config] to e.g. 'mobilenet_v2' or 'resnet18'"
        ) from error
