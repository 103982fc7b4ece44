"""dlm.coder_model: the masked-diffusion coder model, sampler, training and remote serving.

The package import is light (no torch); import submodules for the heavy parts.
"""

from dlm.coder_model.types import CancelToken, Engine, EngineStatus, Prediction, Prompt, SamplerParams

__all__ = ["CancelToken", "Engine", "EngineStatus", "Prediction", "Prompt", "SamplerParams"]
