"""The launch form: which slice, which image, on-demand or spot, and a name."""

from __future__ import annotations

from typing import Any

from django import forms

from sessions.gpus.offers import Offer, offer_choice_label, request_for
from sessions.notebooks.models import NotebookImage


class LaunchForm(forms.Form):
    offer = forms.ChoiceField(label="GPU slice")
    image = forms.ModelChoiceField(queryset=NotebookImage.objects.filter(enabled=True), empty_label=None)
    spot = forms.BooleanField(required=False, label="Spot: cheaper, may be reclaimed")
    server_name = forms.SlugField(
        label="Session name", max_length=39, initial="lab", help_text="Lower-case letters, digits and '-'."
    )

    def __init__(self, *args: Any, offers: list[Offer], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        offer_field = self.fields["offer"]
        assert isinstance(offer_field, forms.ChoiceField)
        offer_field.choices = [(offer.key, offer_choice_label(offer)) for offer in offers]
        self.offers = offers
        default = NotebookImage.objects.filter(enabled=True, default=True).first()
        if default:
            self.fields["image"].initial = default.pk

    def clean_offer(self) -> str:
        key = str(self.cleaned_data["offer"])
        if request_for(key) is None:
            raise forms.ValidationError("Pick one of the listed GPU slices.")
        return key
