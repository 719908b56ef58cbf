"""Named read layouts: the choices about how a read is laid out that only the real weights can settle.

Without DiffusionGemma's weights we cannot measure which of several
plausible layouts reads best, so each open question is a field of
`ReadLayout`, and a server reads with one named layout (`serve --layout`).
The name and its fields are reported in `diagnostics` and hashed into the
calibration fingerprint, so a calibration fit on one layout is never applied
to another, and `canvasread eval --compare` settles each choice on labelled
data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

ThoughtPlacement = Literal["prompt", "canvas"]
LabelForms = Literal["exact", "both"]
Prompts = Literal["request", "canvas"]
Single = Literal["line", "bare"]


@dataclass(frozen=True)
class ReadLayout:
    """One way to lay out a read; `name` is what a person picks, the fields are what it means.

    - `thought`: where the empty thought block `<|channel>thought\\n<channel|>`
      goes. "prompt" (default): appended to the prompt, as the chat template's
      generation prompt and vLLM 0.33's own DiffusionGemma reader put it (its
      comment: "far worse results otherwise"); "canvas": the first canvas
      tokens, as canvasread did before.
    - `label_forms`: "exact" (default) reads each label as the one token the
      canvas holds; "both" also reads its other whitespace form (`" A"` and
      `"A"`), scores the label as the larger of the two and counts both in the
      label mass, as vLLM 0.33's reader does.
    - `prompts`: "request" (default) gives every canvas of a request one
      prompt that lists all its questions, so a request encodes its state
      once; "canvas" gives each canvas a prompt listing only the questions on
      it, as vLLM 0.33's joint reads do (a request then encodes its state once
      per canvas).
    - `single`: how a request with one question is read. "line" (default)
      as any other, an answer line `name: label`; "bare" as vLLM 0.33's
      per-question reads: the question follows the state in the user turn and
      the canvas holds the bare label, the reply's first token.
    """

    name: str
    thought: ThoughtPlacement = "prompt"
    label_forms: LabelForms = "exact"
    prompts: Prompts = "request"
    single: Single = "line"

    def __post_init__(self) -> None:
        if self.thought not in ("prompt", "canvas"):
            raise ValueError(f"thought placement {self.thought!r} is neither 'prompt' nor 'canvas'")
        if self.label_forms not in ("exact", "both"):
            raise ValueError(f"label forms {self.label_forms!r} are neither 'exact' nor 'both'")
        if self.prompts not in ("request", "canvas"):
            raise ValueError(f"prompts {self.prompts!r} are neither 'request' nor 'canvas'")
        if self.single not in ("line", "bare"):
            raise ValueError(f"single-question reads {self.single!r} are neither 'line' nor 'bare'")

    def describe(self) -> dict[str, str]:
        """The layout as reported in diagnostics and hashed into calibration fingerprints."""
        return {key: str(value) for key, value in asdict(self).items()}


DEFAULT_LAYOUT = ReadLayout("default")
LAYOUTS: dict[str, ReadLayout] = {
    layout.name: layout
    for layout in (
        DEFAULT_LAYOUT,
        ReadLayout("thought-on-canvas", thought="canvas"),
        ReadLayout("both-label-forms", label_forms="both"),
        ReadLayout("prompt-per-canvas", prompts="canvas"),
        ReadLayout("bare-single", single="bare"),
    )
}


def layout_named(name: str) -> ReadLayout:
    """The layout called `name`; a `ValueError` listing the known names otherwise."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown read layout {name!r}; choose one of {', '.join(LAYOUTS)}") from None
