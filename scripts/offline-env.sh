# Environment for running Flower, Ray and the model libraries with no network access.
# Source it: `. scripts/offline-env.sh`.
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1  # else every run `uv sync`s torch into a new env
export FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_TELEMETRY_ENABLED=0
export RAY_USAGE_STATS_ENABLED=0
export RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0
export NO_ALBUMENTATIONS_UPDATE=1
export HF_HUB_OFFLINE=1
