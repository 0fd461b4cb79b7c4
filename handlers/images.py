"""Images for models: which models take them, and image references as URLs (no framework imports)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from typing import Any

from chatq.settings import ECHO_MODEL

__all__ = ["VISION_MODELS_ENV", "UserContent", "image_url", "model_accepts_images", "user_content"]

UserContent = str | list[dict[str, Any]]
"""A user message's content in the OpenAI chat format: text, or text and `image_url` parts."""

VISION_MODELS_ENV = "CHATQ_VISION_MODELS"
"""Comma-separated extra model names that take images (for self-hosted vision models)."""

_VISION_PATTERN = re.compile(r"^(gpt-4o|gpt-4\.1|gpt-5|o1|o3|o4|chatgpt-4o)|vision", re.IGNORECASE)

_IMAGE_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def model_accepts_images(model_name: str, vision_models: Sequence[str] = ()) -> bool:
    """True if `model_name` takes image inputs: known vision families, echo, and the `vision_models`
    handed in (`CHATQ_VISION_MODELS`, for self-hosted ones)."""
    name = model_name.strip()
    if name == ECHO_MODEL:
        return True  # echo takes anything and ignores the images
    if name in vision_models:
        return True
    # Provider prefixes ("openai/gpt-4o") are common behind gateways such as LiteLLM or OpenRouter.
    return bool(_VISION_PATTERN.search(name.rsplit("/", 1)[-1]))


def image_url(image: str) -> str:
    """An image reference as a URL a model accepts: http(s) and data: URLs as given, bare base64 as a data: URL."""
    ref = image.strip()
    if ref.startswith(("http://", "https://", "data:")):
        return ref
    try:
        head = base64.b64decode(ref[:64] + "=" * (-len(ref[:64]) % 4), validate=False)
    except (binascii.Error, ValueError):
        head = b""
    mime = next((m for magic, m in _IMAGE_MAGIC if head.startswith(magic)), None)
    if mime is None:
        mime = "image/webp" if head[:4] == b"RIFF" and head[8:12] == b"WEBP" else "image/png"
    return f"data:{mime};base64,{ref}"


def user_content(text: str, images: Sequence[str] = (), *, accepts_images: bool = True) -> UserContent:
    """The user message's content: images become `image_url` parts when the model takes images.

    A model that does not take images gets a short note instead, so it can tell the user why it
    cannot see them rather than pretend there were none.
    """
    refs = [i for i in images if isinstance(i, str) and i.strip()]
    if not refs:
        return text
    if not accepts_images:
        noun = "image was" if len(refs) == 1 else "images were"
        note = f"[{len(refs)} {noun} attached, but this model does not accept images.]"
        return f"{text}\n\n{note}" if text else note
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.extend({"type": "image_url", "image_url": {"url": image_url(i)}} for i in refs)
    return parts
