"""The segmentation network shared by the global and the personalized models."""

from __future__ import annotations

import torch.nn as nn

DEFAULT_DECODER_CHANNELS = (128, 64, 32, 16, 8)
NORMS = ("group", "instance", "batch")
GROUP_NORM_GROUPS = 8


def replace_batch_norm(module: nn.Module, groups: int | None = GROUP_NORM_GROUPS) -> nn.Module:
    """Swap every ``BatchNorm2d`` for a ``GroupNorm`` with the same channels, in place.

    Group normalization (Wu & He 2018) has no running statistics, so a model
    behaves the same in training and evaluation and averaging models never mixes
    statistics of different sites (Hsieh et al. 2020 show batch normalization
    failing under non-IID federated data). ``groups`` is reduced to the largest
    divisor of the channel count not above it; ``None`` gives every channel its
    own group, which is instance normalization with a learned scale and shift
    (Ulyanov et al. 2016): each feature map of each image is standardized,
    ``y = gamma * (x - mean_hw(x)) / sqrt(var_hw(x) + eps) + beta``, which
    removes an image's contrast and colour statistics at every layer.
    """
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            channels = child.num_features
            count = channels if groups is None else max(g for g in range(1, groups + 1) if channels % g == 0)
            setattr(module, name, nn.GroupNorm(count, channels, affine=child.affine))
        else:
            replace_batch_norm(child, groups)
    return module


def build_segmentation_model(
    encoder: str,
    num_structures: int,
    in_channels: int = 3,
    decoder_channels: tuple[int, ...] = DEFAULT_DECODER_CHANNELS,
    norm: str = "group",
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
    norm : {"group", "instance", "batch"}
        ``"group"`` (default) replaces the encoder's and decoder's batch
        normalization with group normalization (see :func:`replace_batch_norm`);
        ``"instance"`` with one group per channel (instance normalization);
        ``"batch"`` keeps batch normalization (FedBN needs it).

    Returns
    -------
    torch.nn.Module
        Maps ``[B, in_channels, H, W]`` to logits ``[B, num_structures, H, W]``;
        ``H`` and ``W`` must be multiples of 32.
    """
    if num_structures < 1:
        raise ValueError(f"num_structures must be >= 1, got {num_structures}")
    if norm not in NORMS:
        raise ValueError(f"segmentation-norm = '{norm}' is not one of {list(NORMS)}")
    # Imported here: smp pulls in timm and torchvision (seconds), which settings checks never need.
    import segmentation_models_pytorch as smp

    try:
        model = smp.Unet(
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
    if norm == "batch":
        return model
    return replace_batch_norm(model, GROUP_NORM_GROUPS if norm == "group" else None)
