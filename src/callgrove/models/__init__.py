"""The one door to a model: name it (`[model]`, `--model NAME`), open it, and get back its chat
format, its sampler (`callgrove.policy`) and its learner (`callgrove.train`), both over the
networks of `callgrove.networks`.

    backend = open_model(model_from_name("tiny"), learner=LearnerSettings())
    backend.chat, backend.sampler, backend.learner
"""

from callgrove.models.backend import Learner, PolicyBackend
from callgrove.models.open import chat_from_files, open_model
from callgrove.models.settings import (
    MODEL_KINDS,
    HfModel,
    ModelSettings,
    TinyModel,
    VllmModel,
    model_from_name,
)

__all__ = [
    "MODEL_KINDS",
    "HfModel",
    "Learner",
    "ModelSettings",
    "PolicyBackend",
    "TinyModel",
    "VllmModel",
    "chat_from_files",
    "model_from_name",
    "open_model",
]
