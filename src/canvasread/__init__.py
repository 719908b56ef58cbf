"""canvasread: a self-hosted System One decision server, and the library under it.

The names below are the public API: open a `Decider` on one or more models,
ask it questions, get Jev-shaped answers. Importing this package never imports
torch or transformers (the base install serves the embedded model without
them); the canvas engine's wing loads them only when a checkpoint is opened.
"""

__version__ = "0.1.0"

from canvasread.backends.base import Backend, FunctionBackend
from canvasread.batching import BatchSettings
from canvasread.calibration import Calibration
from canvasread.canvas.engine.settings import EngineSettings
from canvasread.canvas.vllm.settings import VllmSettings
from canvasread.catalog import open_decider
from canvasread.decide import Decider, DeciderSettings
from canvasread.decision import Decision
from canvasread.errors import (
    BackendFailure,
    BadRequest,
    CalibrationMismatch,
    CanvasreadError,
    ClientDisconnected,
    DeadlineExceeded,
    FieldProblem,
    InvalidRequest,
    MissingExtra,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    UpstreamFailure,
)
from canvasread.settings import ImageLimits, ServerSettings
from canvasread.systemone.settings import SystemOneSettings
from canvasread.types import (
    Capabilities,
    DecisionRequest,
    DecisionResult,
    Distribution,
    ImageAsset,
    JSONValue,
    ModelCard,
    Option,
    Question,
    RequestOptions,
    Usage,
)
from canvasread.upstream.settings import UpstreamSettings
from canvasread.wire import parse_request

__all__ = [
    "Backend",
    "BackendFailure",
    "BadRequest",
    "BatchSettings",
    "Calibration",
    "CalibrationMismatch",
    "CanvasreadError",
    "Capabilities",
    "ClientDisconnected",
    "DeadlineExceeded",
    "Decider",
    "DeciderSettings",
    "Decision",
    "DecisionRequest",
    "DecisionResult",
    "Distribution",
    "EngineSettings",
    "FieldProblem",
    "FunctionBackend",
    "ImageAsset",
    "ImageLimits",
    "InvalidRequest",
    "JSONValue",
    "MissingExtra",
    "ModelCard",
    "ModelNotFound",
    "NotReady",
    "Option",
    "Overloaded",
    "PayloadTooLarge",
    "Question",
    "RequestOptions",
    "ServerSettings",
    "SystemOneSettings",
    "Unauthorized",
    "UpstreamFailure",
    "UpstreamSettings",
    "Usage",
    "VllmSettings",
    "__version__",
    "open_decider",
    "parse_request",
]
