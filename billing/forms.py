"""The staff form that adds a price; the checks themselves live in billing.prices."""

from __future__ import annotations

from django import forms

from billing.models import Market
from sessions.gpus import catalog
from sessions.gpus.models import Slice


class PriceForm(forms.Form):
    model_name = forms.ChoiceField(label="GPU model")
    kind = forms.ChoiceField(choices=Slice.Kind.choices)
    profile = forms.CharField(required=False, max_length=32, help_text="MIG only, e.g. 3g.71gb.")
    market = forms.ChoiceField(choices=Market.choices)
    per_hour = forms.CharField(
        label="Per hour", max_length=20, help_text="At most four decimals; a time-sliced GPU's N shares pay 1/N each."
    )
    effective_from = forms.DateTimeField(
        required=False,
        label="From",
        help_text="Empty: from now. A past moment is refused if it would reprice a holding.",
    )
    source = forms.CharField(max_length=300, label="Why", help_text="The source of the figure or the reason for it.")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        field = self.fields["model_name"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(name, name) for name in catalog.models()]
