"""Language names as the speech models write them and OpenAI's ISO-639-1 codes: the
transcription API's ``languages[]`` (codes) becomes a model's hint (its name), and the
languages a model detected (``ClipStart.language``: Qwen3-ASR writes "English") are answered
as codes. The set is Qwen3-ASR's ``support_languages``."""

from __future__ import annotations

NAMES = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "fa": "Persian", "fi": "Finnish", "fil": "Filipino",
    "fr": "French", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian", "it": "Italian",
    "ja": "Japanese", "ko": "Korean", "mk": "Macedonian", "ms": "Malay", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish",
    "th": "Thai", "tr": "Turkish", "vi": "Vietnamese", "yue": "Cantonese", "zh": "Chinese",
}  # fmt: skip
CODES = {name.lower(): code for code, name in NAMES.items()}


def name_of(code: str) -> str | None:
    """The model's name for an ISO-639-1 code (None: not one the models know)."""
    return NAMES.get(code.strip().lower())


def hint(language: str) -> str:
    """A request's ``language`` as the model takes it: OpenAI's ISO-639-1 code ("en") becomes
    the model's name ("English"); a name, or a code the table lacks, is the model's to take or
    refuse (naming the field)."""
    return name_of(language) or language


def codes_of(names: list[str]) -> list[str]:
    """The codes of the languages a model wrote, in order, each once (unknown ones left out)."""
    out: list[str] = []
    for name in names:
        code = CODES.get((name or "").strip().lower())
        if code is not None and code not in out:
            out.append(code)
    return out
