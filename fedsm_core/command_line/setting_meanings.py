"""What every run-config key means, as a user reads it: the meaning column of ``docs/configuration.md``.

Kept beside the page's generator; the keys, types, defaults and allowed values come
from :class:`fedsm_core.config.RunConfig` itself.
"""

from __future__ import annotations

MEANINGS: dict[str, str] = {
    "num-server-rounds": (
        "federated rounds"
    ),
    "strategy": (
        "`fedsm`, `fedsm-extra`, `fedavg`, `fedprox`, `scaffold`, `harmofl` or `fedbn`"
    ),
    "dataset": (
        "`synthetic-fundus`, `synthetic-prostate`, or the path of a federation spec (`*.toml`)"
    ),
    "held-out-site": (
        "train without this site (leave-one-site-out studies)"
    ),
    "image-size": (
        "side of the square input, a multiple of 32"
    ),
    "data-scale": (
        "generated data: fraction of the paper's site sizes"
    ),
    "data-seed": (
        "generated data: seed"
    ),
    "seed": (
        "model initialisation and local shuffling"
    ),
    "encoder": (
        "segmentation-models-pytorch encoder of the U-Net"
    ),
    "segmentation-norm": (
        "U-Net normalization: `group` (GroupNorm, 8 groups, no running statistics), `instance` (a group per channel), "
        "`batch`, or `auto`: batch for `fedbn`, group otherwise; `fedbn` with `group` or `instance` is refused (it "
        "would keep only affine parameters local, which is not FedBN)"
    ),
    "input-norm": (
        "`per-image`: standardize each channel of each image (zero mean, unit variance) in front of every U-Net, "
        "which removes brightness, contrast and colour-gain differences between sites before any weight sees them "
        "(`fedsm_core/models/input_standardization.py`; the selector is not affected); `none`: images as loaded. "
        "Default `per-image`: on validation every federated method measured is level or ahead with it on all "
        "three datasets; on test FedAvg gains 0.8 points on every seed of synthetic-fundus-style (docs/results.md, "
        "the ladder)"
    ),
    "batch-size": (
        "local minibatch size"
    ),
    "local-epochs": (
        "local passes over the training split per round"
    ),
    "max-local-steps": (
        "cap on local minibatches per round (0: no cap)"
    ),
    "local-steps": (
        "every site takes exactly this many minibatches per round, however many images it holds (0: `local-epochs` "
        "passes; replaces `local-epochs` and `max-local-steps`)"
    ),
    "min-local-steps": (
        "a site whose round would take fewer minibatches takes exactly this many (as `local-steps` would), a site "
        "with more takes its pass as usual: for federations with sites of a few images (0: never)"
    ),
    "augmentation": (
        "`none`, `flip` (random horizontal/vertical flips) or `affine` (flips, small affine warp, brightness/contrast)"
    ),
    "style-augmentation": (
        "probability that a segmentation model trains on an image in a random other acquisition style (gamma, "
        "contrast, brightness, colour gains, blur, noise: `fedsm_core/data/style.py`) instead of its own; "
        "centralized training gets the same. FedSM's selector always sees the images as they are"
    ),
    "lr": (
        "Adam learning rate of global and personalized U-Nets"
    ),
    "lr-schedule": (
        "the learning rate over rounds: `constant` or `cosine` (from `lr` after the warm-up down to `lr * "
        "lr-min-factor` in round `num-server-rounds`), for every model the sites train with `lr`; centralized "
        "training follows the same curve over its passes (`fedsm_core/training/lr_schedule.py`)"
    ),
    "lr-warmup-rounds": (
        "rounds of linear warm-up: round `r <= W` trains at `lr * r / (W + 1)`"
    ),
    "lr-min-factor": (
        "the cosine's floor as a fraction of `lr`"
    ),
    "selector-lr": (
        "Adam learning rate of the selector"
    ),
    "selector-width": (
        "base width of the selector (VGG-11 uses 64)"
    ),
    "selector-negatives": (
        "also train the selector on restyled copies of local images labelled \"any other site\""
    ),
    "selector-weighting": (
        "average the selector and its moments per site (`equal`) or by `n_k / n` (`size`)"
    ),
    "selector-moments": (
        "the selector's Adam moments: kept at each site and never sent (`local`), or averaged by the server and "
        "sent every round (`averaged`)"
    ),
    "selector-head": (
        "`fitted`: before every evaluation, set the selector's linear head from the sites' embedding statistics "
        "(LDA); `trained`: keep the head federated training left"
    ),
    "selector-shrinkage": (
        "weight of the scaled identity in the fitted head's covariance, in [0, 1]"
    ),
    "softpull-lambda": (
        "SoftPull `lam`, in `[1/K, 1]`. The default is the value the reference study chose on validation for both "
        "generated datasets (`experiments/results/reference/tune-synthetic-fundus*/chosen.json`: 0.99 against 0.5 "
        "/ 0.7 / 0.9 / 0.95); on `drishti-six-site` it chose 0.5"
    ),
    "personalization": (
        "how FedSM trains site k's personalized model: `softpull` (FedSM's own), `ft`, `apfl`, `ditto`, "
        "`perfedavg`, `pfedme` (`fedsm_core/algorithms/personalization/`); methods other than `softpull` keep "
        "personalized models local (no SoftPull; `softpull-lambda` unused) and need strategy `fedsm` or "
        "`fedsm-extra`"
    ),
    "apfl-alpha": (
        "APFL's initial mixing weight `alpha` of `alpha v + (1 - alpha) w`, in `[0, 1]`"
    ),
    "apfl-alpha-lr": (
        "SGD step size of APFL's `alpha` update (0: `alpha` fixed)"
    ),
    "ditto-lambda": (
        "Ditto's `lambda` of `lambda / 2 * ||v - w||^2`"
    ),
    "perfedavg-alpha": (
        "Per-FedAvg's inner (adaptation) step size `alpha`"
    ),
    "perfedavg-steps": (
        "Per-FedAvg's inner steps, in training and for the deployed model"
    ),
    "pfedme-lambda": (
        "pFedMe's `lambda` (with `pfedme-eta * pfedme-lambda <= 1`)"
    ),
    "pfedme-k": (
        "pFedMe's inner steps `K` per minibatch"
    ),
    "pfedme-eta": (
        "pFedMe's local step size `eta` of `w_k <- w_k - eta * lambda * (w_k - theta_k)`"
    ),
    "extra-rounds": (
        "FedSM-extra: selector rounds after the `num-server-rounds` model rounds"
    ),
    "amplitude-normalization": (
        "HarmoFL's amplitude normalization in front of every U-Net (always on with `strategy = \"harmofl\"`)"
    ),
    "amplitude-decay": (
        "`v` of each site's running average amplitude"
    ),
    "amplitude-window": (
        "low-frequency window the layer replaces: 0 = whole spectrum, 1 = the DC term only, `w` = `|u|, |v| < w`"
    ),
    "amplitude-freeze-round": (
        "after this round the server averages the sites' amplitudes into one and fixes it (0: never fixed, "
        "averaged every round)"
    ),
    "weight-perturbation": (
        "HarmoFL's weight perturbation in local training (always on with `strategy = \"harmofl\"`)"
    ),
    "perturbation-alpha": (
        "radius `alpha` of the perturbation `alpha * g / ||g||`"
    ),
    "knn-per": (
        "at the test evaluation, each site also scores kNN-Per on the global model (`dice-knn-per`) and, "
        "under FedSM, on each image's routed model (`dice-super-knn`)"
    ),
    "knn-k": (
        "kNN-Per: neighbours per pixel"
    ),
    "knn-kernel-scale": (
        "kNN-Per: `scale` of the kernel `exp(-d^2 / (dim * scale))`"
    ),
    "knn-capacity": (
        "kNN-Per: most pixels a site's datastore holds"
    ),
    "knn-pixels-per-image": (
        "kNN-Per: pixels sampled from each training image"
    ),
    "proximal-mu": (
        "FedProx's `mu` (used when `strategy = \"fedprox\"`)"
    ),
    "server-optimizer": (
        "the server's step from the global model toward the sites' weighted average, for FedAvg, FedProx, SCAFFOLD "
        "and HarmoFL: `none` (FedAvg: the average is the new model), `momentum` (FedAvgM), `adam` (FedAdam), "
        "`yogi` (FedYogi); same formulas as Flower's `FedAvgM` / `FedAdam` / `FedYogi` (tested against them), "
        "written once on weight dictionaries in `fedsm_core/algorithms/server_optimizer.py`; its moments are kept "
        "in checkpoints. Applies to FedSM's global model too (not to its personalized models, which SoftPull "
        "mixes, nor to its selector)"
    ),
    "server-lr": (
        "the server learning rate `eta` (`momentum` with `server-lr = 1`, `server-momentum = 0` is FedAvg)"
    ),
    "server-momentum": (
        "FedAvgM's momentum"
    ),
    "server-beta1": (
        "FedAdam's and FedYogi's first-moment decay"
    ),
    "server-beta2": (
        "FedAdam's and FedYogi's second-moment decay"
    ),
    "server-tau": (
        "FedAdam's and FedYogi's adaptivity (added to the root of the second moment)"
    ),
    "step-normalization": (
        "`fednova`: before the server's step, divide each site's update by the local steps it took (FedNova, Wang "
        "et al. 2020; sites report `steps`, and a reply without a valid count is rejected), so sites that take "
        "more steps per round no longer pull the model further by that alone; with equal steps it is FedAvg. Same "
        "models as `server-optimizer` (FedSM's global model included); needs `aggregation = \"mean\"`"
    ),
    "site-weighting": (
        "how much each site's model counts in the average: `size` (`n_k / n`, FedAvg) or `equal` (`1 / K`: a site "
        "of 12 images counts as much as one of 100, as the client average of the test Dice counts them). Same "
        "models as `server-optimizer`; FedSM's selector has its own `selector-weighting`"
    ),
    "aggregation": (
        "how every shared model averages the sites' replies: `mean` (weighted by `n_k`, FedAvg), or a statistic "
        "one malicious site cannot drag, unweighted because a site's claimed size is what it controls: "
        "`trimmed-mean` (per coordinate, `trim-fraction` cut at each end), `median` (per coordinate) or `krum` "
        "(the one reply nearest its neighbours); or `filtered-mean`, the weighted mean of the replies within "
        "`filter-factor` typical distances of the coordinate median (FedAvg exactly when none stands out). "
        "Applies to the global model, the selector, SCAFFOLD's control variate, FedBN's shared part, HarmoFL's "
        "amplitude and SoftPull's pull (`fedsm_core/algorithms/robust_aggregation.py`). The default, `filtered-mean` "
        "with `filter-memory`, was the best robust setting of the robustness study, at no measurable cost "
        "without attack (`experiments/results/robustness`); `mean` reproduces the paper's FedAvg averaging"
    ),
    "trim-fraction": (
        "`trimmed-mean`: the fraction of the sites' values cut at each end of every coordinate (of 6 sites, "
        "0.2 cuts one at each end)"
    ),
    "krum-byzantine": (
        "`krum`: `f`, the malicious sites Krum tolerates; it needs `2f + 3` replies (one more for SoftPull)"
    ),
    "filter-factor": (
        "`filtered-mean`: a reply farther from the coordinate median than this many times the median of the "
        "replies' distances is left out of the mean (`fedsm_core/algorithms/filtered_mean.py`)"
    ),
    "filter-min-cosine": (
        "`filtered-mean`, global models: a reply whose update (from the round's global model) has a cosine below "
        "this with the coordinate median of the updates is left out too, however near it lies; -1: off "
        "(`fedsm_core/algorithms/filtered_mean.py`)"
    ),
    "filter-memory": (
        "`filtered-mean`, global models: also leave out a site whose mean distance ratio over the rounds so far "
        "exceeds `filter-factor`, so a site that stands out round after round stays out in the rounds it dips "
        "under the bound (`fedsm_core/algorithms/filter_memory.py`)"
    ),
    "clip-update-norm": (
        "cut each site's update of a global model to at most this many times the median update norm before "
        "averaging (0: off), so no site moves the average by the length of its update alone "
        "(`fedsm_core/algorithms/update_clipping.py`)"
    ),
    "attack": (
        "simulation only: make sites malicious, `<site>:<attack>` comma-separated, e.g. `site-6:sign-flip`; "
        "attacks: `sign-flip` (sends `w - s (w_k - w)`), `noise` (a Gaussian update `s` times the honest norm), "
        "`label-flip` (trains on inverted masks), `inflate-count` (claims 100x its images), and for FedSM "
        "`poison-personalized` (its personalized model sign-flipped) and `fake-statistics` (another site's "
        "selector statistics). The ServerApp refuses it with deployment SuperNodes "
        "(`fedsm_core/algorithms/attacks.py`)"
    ),
    "attack-scale": (
        "`s` of `sign-flip`, `noise` and `poison-personalized`"
    ),
    "optimizer-state": (
        "a site's Adam for each model it trains (the single model of FedAvg and its variants and FedBN; FedSM's "
        "global copy, and its personalized model where that takes plain optimizer steps, as SoftPull and `ft` do): "
        "`reset` starts a fresh Adam every round; `local` keeps each site's Adam state (moments and step count) on "
        "the site's disk from one round to the next, never sent (`client_app/site_state.py`); `averaged` (FedAvg, "
        "FedProx, SCAFFOLD, HarmoFL: the one model every site trains alike) sends each site's Adam state back with "
        "its model, and every site starts the next round from their average, weighted as the model is "
        "(`site-weighting`). FedSM's selector follows `selector-moments`. Centralized training (the experiments' "
        "pooled baseline) trains as one site holding every image: a fresh Adam every `local-epochs` passes under "
        "`reset`, one Adam over all passes otherwise"
    ),
    "gamma": (
        "selector confidence threshold of Algorithm 2 (used as given with `gamma-selection = \"fixed\"`)"
    ),
    "gamma-selection": (
        "how every validation round chooses gamma from 0, 0.05, ..., 1: `validation`, one for all (the best pooled "
        "validation Dice of the super model, so large sites weigh most); `client-average`, one for all (the best "
        "mean of the sites' validation Dice, every site weighing the same); `per-model`, one per personalized model "
        "(the largest validation gain over the global model); `fixed`, `gamma` as given. The last round's choice is "
        "used for the test split and saved in the bundle"
    ),
    "route-by": (
        "how the super model routes: `image`, Algorithm 2 for every image alone (the paper); `case`, once per case "
        "(a patient's slices, named by the example ids), from the mean of its slices' selector log-probabilities "
        "(argmax the site, the global model when the softmax of those means is at most gamma), the route applying "
        "to every slice of the case. Images whose id names no case (fundus) are routed alone either way "
        "(docs/algorithm.md)"
    ),
    "fine-tune-passes": (
        "0: the personalized models are the ones the rounds trained (the paper). `E > 0`: after the last round every "
        "site fine-tunes the final global model on its training split for up to `E` passes (one Adam at `lr`) and "
        "keeps the pass best on its validation split as its personalized model, in place of SoftPull's; the last "
        "validation then chooses gamma for the fine-tuned super model; when the stopping rule ends the rounds, the "
        "sites fine-tune after its round and that round is validated again. The default, 30, won on validation "
        "(docs/results.md). Read by strategy `fedsm` only; the others ignore it (docs/algorithm.md)"
    ),
    "fine-tune-gamma": (
        "with `fine-tune-passes > 0`, how each site scores its own validation images when the last validation "
        "chooses gamma: `cross-fit`, each half of its validation split (halved by case) with the fine-tuning pass "
        "best on the other half, so the pass choice does not flatter the model it chose; `validation`, with the "
        "kept model itself. The deployed model is the pass best on the whole split either way. `cross-fit` sent "
        "synthetic-prostate's images to the global model where the fine-tuned models lost on test "
        "(docs/results.md)"
    ),
    "eval-every": (
        "validation every this many rounds (the last round always); a FedSM validation round sends the whole super "
        "model (global, K personalized, selector) to every site, which costs about as much as a training round"
    ),
    "stop-window": (
        "stopping rule (0: off, the run lasts `num-server-rounds`): end training once the best pooled validation "
        "score (`dice-super` for FedSM, else `dice-global`) has gained less than `stop-min-gain` over this many "
        "rounds; checked after rounds `stop-min-rounds + k * stop-check-every` that have a validation, then the "
        "test runs at that round. Not with `fedsm-extra` (its selector rounds start at `num-server-rounds`)"
    ),
    "stop-min-gain": (
        "the rule's smallest gain that counts (Dice in [0, 1]: 0.002 = 0.2 points)"
    ),
    "stop-min-rounds": (
        "the rule ends no run before this round"
    ),
    "stop-check-every": (
        "the rule is looked at every this many rounds from `stop-min-rounds` on"
    ),
    "output-dir": (
        "parent folder of run folders (the run script passes an absolute path)"
    ),
    "device": (
        "`auto` (CUDA when present), `cpu` or `cuda`; a node config `device` (e.g. `cuda:1`) wins for that node "
        "(docs/gpus.md)"
    ),
    "precision": (
        "local-training arithmetic: `auto` (bf16 on a CUDA GPU that supports it, else fp32), `fp32`, `bf16`, "
        "`fp16` (with a gradient scaler)"
    ),
    "deterministic": (
        "CUDA only: deterministic cuDNN algorithms instead of the fastest (`cudnn.benchmark`)"
    ),
    "torch-threads": (
        "torch CPU threads per client (0: torch default)"
    ),
    "min-replies": (
        "fewest valid replies a round needs; fewer stops the run (resume from its checkpoint)"
    ),
    "resume-from": (
        "a `checkpoint.pt` to continue from; one of the last round is only finished, and may then change "
        "`fine-tune-passes` and `fine-tune-gamma` (docs/running.md)"
    ),
    "round-timeout": (
        "seconds to wait for replies in one round"
    ),
}
