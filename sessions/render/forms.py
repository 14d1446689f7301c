"""The render upload form, the main-file choice of a zip with several scenes, and the staff's job filter.

The scene itself is not in the form's body: it goes up first, in parts (sessions/render/tus.py), and the form
names the upload and the SHA-256 the page computed of the file. A form refused for one of its settings keeps
the upload, so the settings can be corrected without sending the file again.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.http import QueryDict

from sessions.gpus.models import Slice
from sessions.gpus.offers import Offer, offer_choice_label, request_for
from sessions.render import frames
from sessions.render.jobs import JobChoices
from sessions.render.models import RenderJob
from sessions.render.scenefile import size_words
from sessions.render.services import writable_formats


class RenderJobForm(forms.Form):
    frames = forms.CharField(
        label="Frames",
        max_length=500,
        initial="1",
        # An empty field gets the spec's own words, with an example, not Django's "This field is required."
        error_messages={"required": frames.EMPTY},
        help_text="A frame (<code>12</code>), a range (<code>1-250</code>), every n-th frame of a range "
        "(<code>50-60x2</code>), or a list of those: <code>1-30, 45, 50-60x2</code>.",
    )
    resolution_percent = forms.IntegerField(
        label="Resolution (% of the scene's)", min_value=1, max_value=100, initial=100
    )
    samples = forms.IntegerField(
        label="Samples", min_value=1, max_value=65536, required=False, help_text="Empty: the scene's own setting."
    )
    output_format = forms.ChoiceField(
        label="Output format",
        choices=RenderJob.OutputFormat.choices,
        help_text="OpenEXR is offered where the render image's Blender writes it.",
    )
    offer = forms.ChoiceField(label="GPU slice")
    spot = forms.BooleanField(required=False, label="Spot: cheaper, may be reclaimed (the chunk is rendered again)")
    chunk_size = forms.IntegerField(
        label="Frames per chunk", min_value=1, initial=4, help_text="Each chunk is one container run on one slice."
    )
    max_slices = forms.IntegerField(
        label="Slices at once",
        min_value=1,
        initial=1,
        help_text="Chunks go to whichever of the job's slices is free.",
    )
    main_file = forms.CharField(
        label="Main .blend inside the zip",
        max_length=1024,
        required=False,
        help_text="Only for a zip holding several .blend files, e.g. <code>shots/main.blend</code>; "
        "leave it empty and you are asked after the upload.",
    )
    # The scene went up already, in parts (sessions/render/tus.py); the page's script puts its address and the
    # SHA-256 it computed of the file here. Without them nothing was uploaded.
    upload = forms.SlugField(
        max_length=32,
        widget=forms.HiddenInput,
        error_messages={"required": "Choose the scene's file (.blend, or a .zip with its assets) to upload it."},
    )
    sha256 = forms.RegexField(
        regex=r"^[0-9a-fA-F]{64}$",
        widget=forms.HiddenInput,
        error_messages={
            "required": "The page did not say the file's SHA-256; reload it and upload the file again.",
            "invalid": "The page did not say the file's SHA-256; reload it and upload the file again.",
        },
    )

    def __init__(self, *args: Any, offers: list[Offer], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offers = offers
        offer_field = self.fields["offer"]
        assert isinstance(offer_field, forms.ChoiceField)
        offer_field.choices = [(offer.key, offer_choice_label(offer)) for offer in offers]
        self.scene_help = f"At most {size_words(settings.RENDER_MAX_UPLOAD_BYTES)}."
        self._offer_writable_formats()

    def scene_refused(self, message: str) -> None:
        """The upload was refused and removed: the form asks for the file again, saying why."""
        data = QueryDict(mutable=True)
        data.update(self.data)
        data["upload"] = data["sha256"] = ""
        self.data = data
        self.add_error("upload", message)

    def _offer_writable_formats(self) -> None:
        """The formats the render image's Blender writes, as its last probe said (all of ours until one has)."""
        writes = writable_formats()
        if writes is None:
            return
        field = self.fields["output_format"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(value, label) for value, label in RenderJob.OutputFormat.choices if value in writes]
        if RenderJob.OutputFormat.OPEN_EXR not in writes:
            field.help_text = "This portal's Blender build writes no OpenEXR."

    def clean_frames(self) -> tuple[int, ...]:
        try:
            return frames.parse(self.cleaned_data["frames"], settings.RENDER_MAX_FRAMES)
        except frames.FrameSpecError as error:
            raise forms.ValidationError(str(error)) from None

    def clean_offer(self) -> str:
        key = str(self.cleaned_data["offer"])
        if request_for(key) is None:
            raise forms.ValidationError("Pick one of the listed GPU slices.")
        return key

    def clean_chunk_size(self) -> int:
        """No more frames to a chunk than a job may render (past that it means nothing, and past the database's
        whole numbers it could not be stored)."""
        wanted = int(self.cleaned_data["chunk_size"])
        if wanted > settings.RENDER_MAX_FRAMES:
            raise forms.ValidationError(
                f"A chunk holds at most {settings.RENDER_MAX_FRAMES:,} frames, the most a job renders."
            )
        return wanted

    def clean_max_slices(self) -> int:
        wanted = int(self.cleaned_data["max_slices"])
        if wanted > settings.MAX_SLICES_PER_USER:
            raise forms.ValidationError(f"A person holds at most {settings.MAX_SLICES_PER_USER} slices at once.")
        return wanted

    def choices(self) -> JobChoices:
        data = self.cleaned_data
        request = request_for(data["offer"])
        assert request is not None
        market = Slice.Market.SPOT if data["spot"] else Slice.Market.ON_DEMAND
        return JobChoices(
            frame_spec=self.data.get("frames", "").strip()[:500],
            frames=data["frames"],
            resolution_percent=data["resolution_percent"],
            samples=data["samples"],
            output_format=data["output_format"],
            request=request,
            market=market,
            chunk_size=data["chunk_size"],
            max_slices=data["max_slices"],
            main_file=data["main_file"].strip(),
        )


class MainFileForm(forms.Form):
    main_file = forms.ChoiceField(label="Which .blend is the scene?", widget=forms.RadioSelect)

    def __init__(self, *args: Any, job: RenderJob, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["main_file"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(name, name) for name in job.blend_files]


class JobFilterForm(forms.Form):
    """Staff: everyone's jobs, narrowed to one person or one state."""

    owner = forms.CharField(label="User", required=False, max_length=150)
    state = forms.ChoiceField(label="State", required=False, choices=[("", "Any"), *RenderJob.State.choices])
