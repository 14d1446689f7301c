"""Operator forms for one GPU: its MIG policy, its static MIG layout, and how a non-MIG GPU is shared.

They only parse what was typed; the rules live in ``sessions.gpus.fleet``, whose
refusals the views add to these forms as errors.
"""

from __future__ import annotations

from typing import Any

from django import forms

from sessions.gpus.catalog import GpuModel
from sessions.gpus.models import Gpu
from sessions.gpus.presets import parse_layout, presets


def describe_layout(layout: list[tuple[str, int]]) -> str:
    """The text form of a layout, as the custom-layout field takes it: '2g.35gb@0, 3g.71gb@4'."""
    return ", ".join(f"{profile}@{start}" for profile, start in layout)


class PolicyForm(forms.Form):
    policy = forms.ChoiceField(
        label="MIG policy",
        choices=Gpu.Policy.choices,
        help_text="Static: a fixed layout of instances that slices are taken from. "
        "Dynamic: an instance is created for each slice and destroyed when it ends.",
    )


class LayoutForm(forms.Form):
    preset = forms.ChoiceField(label="Preset layout", required=False)
    layout_text = forms.CharField(
        label="Or a custom layout",
        required=False,
        max_length=500,
        help_text="Each instance as PROFILE@FIRST-MEMORY-SLICE, separated by commas.",
    )

    def __init__(self, *args: Any, gpu_model: GpuModel, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layouts = presets(gpu_model)
        choices = [(name, f"{name}: {describe_layout(layout)}") for name, layout in self.layouts.items()]
        preset = self.fields["preset"]
        assert isinstance(preset, forms.ChoiceField)
        preset.choices = [("", "— choose a preset —"), *choices]
        example = self.layouts.get("all-balanced") or next(iter(self.layouts.values()), [])
        self.fields["layout_text"].widget.attrs["placeholder"] = describe_layout(example)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        preset, text = data.get("preset"), (data.get("layout_text") or "").strip()
        if preset and text:
            raise forms.ValidationError("Choose a preset or type a layout, not both.")
        if preset:
            data["layout"] = self.layouts[preset]
        elif text:
            try:
                data["layout"] = parse_layout(text)
            except ValueError as error:
                self.add_error("layout_text", str(error))
        elif not self.has_error("preset"):
            raise forms.ValidationError("Choose a preset or type a layout.")
        return data


class SharingForm(forms.Form):
    sharing = forms.ChoiceField(
        label="Sharing",
        choices=[(Gpu.Sharing.WHOLE, Gpu.Sharing.WHOLE.label), (Gpu.Sharing.SHARED, Gpu.Sharing.SHARED.label)],
        help_text="Time-sliced sessions share the GPU's memory with no isolation between them.",
    )
    share_limit = forms.IntegerField(
        label="Sessions at once when time-sliced",
        required=False,
        widget=forms.NumberInput(attrs={"inputmode": "numeric"}),
    )
