"""Images of vision-language data set rows: found, loaded, checked, and matched to the prompt's image parts.

As in TRL 1.16, a row carries its images in an ``image`` column (one) or an ``images`` column (a list), and
the prompt's messages hold one ``{"type": "image"}`` placeholder per image, which the processor's chat
template turns into image tokens. This module is the one place that reads those columns:

- :func:`has_images` / :func:`row_images`: a row's images, each loaded whole from any form a data set holds
  (a PIL image, a file path, encoded bytes, or the ``{"bytes", "path"}`` dict of an undecoded ``datasets``
  ``Image`` feature) and converted to RGB;
- :func:`with_image_parts`: the prompt as structured messages with exactly one placeholder per image (what
  TRL's ``prepare_multimodal_messages`` builds, without putting the images into the parts);
- :func:`check_image_rows`: every row's images opened and counted against its prompt before any model
  loads, so a broken file or a miscounted prompt is refused in one sentence naming the data set, the row
  and the column, not deep inside a processor during training.

grpokit never fetches images at run time: a URL is refused. PIL is imported inside the functions, so
``import grpokit`` stays light.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpokit.data.chat import is_conversational
from grpokit.data.integrity import InputError

if TYPE_CHECKING:
    import PIL.Image

__all__ = ["IMAGE_COLUMNS", "check_image_rows", "has_images", "image_names", "row_images", "with_image_parts"]

IMAGE_COLUMNS = ("image", "images")
"""The columns that carry a row's images: ``image`` (one) and ``images`` (a list), as in TRL."""

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_PAYLOAD_KEYS = ("image", "url", "path", "base64")
"""Keys under which a chat template's image part could carry its own image; grpokit's travel separately."""


def has_images(row: Mapping[str, Any]) -> bool:
    """True when the row has a non-None ``image`` or a non-empty ``images`` column."""
    return _present(row.get("image")) or _present(row.get("images"))


def row_images(row: Mapping[str, Any], where: str) -> list[PIL.Image.Image]:
    """The row's images in order, each fully loaded (file closed) and converted to RGB.

    ``images`` is a list (a single value is taken as a one-item list); ``image`` is one image; a row with
    both holding images is refused (TRL would read ``images`` and silently drop ``image``); when one of
    the two is ``None`` or empty, the other is used. Each image may be a PIL image,
    a path (``str`` or :class:`~pathlib.Path`, ``~`` expanded), the raw bytes of an encoded image, or a
    ``{"bytes": ..., "path": ...}`` dict as ``datasets``' ``Image(decode=False)`` stores it (the bytes win
    when both are set). An EXIF orientation is applied, as ``datasets`` does when it decodes. Refused with
    :class:`InputError` naming ``where`` and the column (and index): a URL, a missing file, a file or bytes
    that are not a readable image, an empty or zero-size image, any other type.
    """
    image, images = row.get("image"), row.get("images")
    if _present(image) and _present(images):
        raise InputError(
            f"{where}: has both an 'image' and an 'images' column; keep one (put a single image in "
            f"'images' as a one-item list, or drop the column that is not meant)"
        )
    if _present(images):
        values = list(images) if isinstance(images, (list, tuple)) else [images]
        return [_load(value, f"{where} column 'images'[{index}]") for index, value in enumerate(values)]
    if _present(image):
        return [_load(image, f"{where} column 'image'")]
    return []


def image_names(row: Mapping[str, Any]) -> list[str]:
    """What names each of a row's images in a log: a file's path as given, else ``sha256:<16 hex digits>
    <width>x<height>`` of its RGB pixels (the same image gives the same name, whatever its form)."""
    if not has_images(row):
        return []
    images = row.get("images") if _present(row.get("images")) else [row.get("image")]
    values = list(images) if isinstance(images, (list, tuple)) else [images]
    names = []
    for value, image in zip(values, row_images(row, "a logged row")):
        if isinstance(value, (str, Path)):
            names.append(str(value))
            continue
        if isinstance(value, Mapping) and value.get("path") and not value.get("bytes"):
            names.append(str(value["path"]))
            continue
        digest = hashlib.sha256(image.tobytes()).hexdigest()[:16]
        names.append(f"sha256:{digest} {image.width}x{image.height}")
    return names


def with_image_parts(prompt: Any, num_images: int, where: str) -> list[dict[str, Any]]:
    """The conversational ``prompt`` as structured messages holding exactly ``num_images`` image parts.

    As TRL's ``prepare_multimodal_messages``: every string content becomes ``[{"type": "text", "text": ...}]``
    and, when the prompt has no image parts, ``num_images`` ``{"type": "image"}`` parts are inserted at the
    start of the first ``user`` message (after any system message). A prompt that already has image parts
    must have exactly ``num_images`` of them. Parts carry no image (the images travel separately; the chat
    template needs only the placeholder): an image part that holds its own image (``image``, ``url``,
    ``path`` or ``base64``) is refused. The input is never mutated; ``None`` contents (an assistant turn
    with only ``tool_calls``) stay ``None``.

    Where TRL differs: it inserts the placeholders only into a user message whose content is still a string
    (so a prompt already structured but without image parts is refused there, and a later string-content
    user message can receive them); here they always go to the first user message.

    A plain-string prompt is refused (:class:`InputError`): images need a conversational prompt, as TRL
    refuses them ("Multimodal training requires conversational prompts"); wrapping the string as a user
    message would silently change the text the policy sees (the chat template applied to it).
    """
    if isinstance(prompt, str) or not is_conversational(prompt) or not prompt:
        got = "a plain string" if isinstance(prompt, str) else type(prompt).__name__
        raise InputError(
            f"{where}: images need a conversational prompt (a list of {{'role', 'content'}} messages) to "
            f"place them in; got {got}. Write the prompt as [{{'role': 'user', 'content': ...}}], not text "
            f"with a chat template already applied"
        )
    messages = [_structured(message, turn, where) for turn, message in enumerate(prompt)]
    found = sum(_count_image_parts(message) for message in messages)
    if found == 0 and num_images > 0:
        return _insert_placeholders(messages, num_images, where)
    if found != num_images:
        raise InputError(
            f"{where}: the prompt has {found} image part(s) but the row has {num_images} image(s); give one "
            f"{{'type': 'image'}} part per image, or none (grpokit then puts them before the first user text)"
        )
    return messages


def check_image_rows(rows: Sequence[Mapping[str, Any]], name: str) -> int:
    """Check the images of every row of the data set ``name``; the number of rows that have images.

    Each image is loaded once (then dropped), so a missing or broken file is refused before any model
    loads; a conversational prompt's image parts must match its row's images (:func:`with_image_parts`);
    a row with images needs a conversational prompt, and a row without images may not have image parts in
    its prompt. Rows with images and rows without may be mixed (TRL allows it: a row's image is ``None``).
    """
    count = 0
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise InputError(f"{name} row {index}: expected a dict, got {type(row).__name__}")
        where = f"{name} row {index}"
        num_images = len(row_images(row, where))
        count += num_images > 0
        prompt = row.get("prompt")
        if num_images > 0 or is_conversational(prompt):
            with_image_parts(prompt, num_images, f"{where} field 'prompt'")
    return count


def _present(value: Any) -> bool:
    """A column value that holds something: not None, and not an empty list."""
    if value is None:
        return False
    return not (isinstance(value, (list, tuple)) and len(value) == 0)


def _load(value: Any, where: str) -> PIL.Image.Image:
    """One image from any accepted form, loaded and RGB."""
    import PIL.Image

    if isinstance(value, PIL.Image.Image):
        return _finish(value, where)
    if isinstance(value, (str, Path)):
        return _open_file(value, where)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _open_bytes(bytes(value), where)
    if isinstance(value, Mapping) and set(value) <= {"bytes", "path"}:
        return _open_undecoded(value, where)
    if value is None:
        raise InputError(f"{where}: is None; give an image or remove the entry")
    raise InputError(
        f"{where}: expected a PIL image, a file path, image bytes or a {{'bytes', 'path'}} dict, got "
        f"{type(value).__name__}"
    )


def _open_undecoded(value: Mapping[str, Any], where: str) -> PIL.Image.Image:
    """``datasets``' undecoded image: ``{"bytes": ..., "path": ...}``; the bytes win when both are set."""
    data, path = value.get("bytes"), value.get("path")
    if data is not None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InputError(f"{where}: 'bytes' must be bytes, got {type(data).__name__}")
        return _open_bytes(bytes(data), where)
    if path is not None:
        if not isinstance(path, (str, Path)):
            raise InputError(f"{where}: 'path' must be a string, got {type(path).__name__}")
        return _open_file(path, where)
    raise InputError(f"{where}: the image dict holds neither 'bytes' nor a 'path'")


def _open_file(value: str | Path, where: str) -> PIL.Image.Image:
    """The image file at a local path (``~`` expanded); URLs are refused."""

    text = str(value)
    if _URL.match(text):
        raise InputError(
            f"{where}: {_short(text)} is a URL; download the image and give its local path (grpokit does "
            f"not fetch images at run time)"
        )
    if text.startswith("data:"):
        raise InputError(f"{where}: {_short(text)} is a data: URI; decode it and give the image's bytes")
    path = Path(text).expanduser()
    _check_file(path, where)
    return _decoded(path, where, f"file {_short(str(path))}")


def _check_file(path: Path, where: str) -> None:
    """``path`` is an existing, non-empty regular file."""
    try:
        if not path.is_file():
            found = "does not exist" if not path.exists() else "is not a file"
            raise InputError(f"{where}: image file {_short(str(path))} {found}")
        size = path.stat().st_size
    except OSError as err:  # a name too long, a folder that may not be read
        raise InputError(f"{where}: image file {_short(str(path))} cannot be read ({_reason(err)})") from None
    if size == 0:
        raise InputError(f"{where}: image file {_short(str(path))} is empty (0 bytes)")


def _open_bytes(data: bytes, where: str) -> PIL.Image.Image:
    """An image encoded in ``data`` (PNG, JPEG, ...)."""

    if not data:
        raise InputError(f"{where}: the image bytes are empty")
    return _decoded(io.BytesIO(data), where, f"the {len(data)} bytes")


def _decoded(source: Any, where: str, what: str) -> PIL.Image.Image:
    """The image PIL decodes from ``source`` (a path or a file object), finished; a decoding error is the
    row's refusal naming ``what`` was read."""
    import PIL.Image

    try:
        with PIL.Image.open(source) as image:
            return _finish(image, where, what)
    except InputError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, PIL.Image.DecompressionBombError) as err:
        verb = "are" if what.startswith("the ") else "is"
        raise InputError(f"{where}: {what} {verb} not a readable image ({_reason(err)})") from None


def _finish(image: PIL.Image.Image, where: str, what: str = "the image") -> PIL.Image.Image:
    """``image`` loaded whole, EXIF orientation applied, as a new RGB image; zero-size refused."""
    import PIL.ImageOps

    if image.width == 0 or image.height == 0:
        raise InputError(f"{where}: {what} has zero size ({image.width}x{image.height})")
    image.load()
    if image.getexif().get(0x0112) is not None:  # Orientation: datasets applies it when it decodes
        image = PIL.ImageOps.exif_transpose(image)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # PIL's own advice for palette transparency before RGB
    return image.convert("RGB")  # always a new image: the caller's is not aliased


def _count_image_parts(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for part in content if part.get("type") == "image")


def _structured(message: Any, turn: int, where: str) -> dict[str, Any]:
    """A copy of ``message`` whose content is a list of parts (string contents wrapped as one text part)."""
    if not isinstance(message, Mapping):
        raise InputError(f"{where}: message {turn} must be a dict, got {type(message).__name__}")
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content}]}
    if content is None:
        return dict(message)
    if not isinstance(content, Sequence):
        raise InputError(
            f"{where}: message {turn} content must be a string or a list of parts, got "
            f"{type(content).__name__}"
        )
    return {**message, "content": [_part(part, turn, index, where) for index, part in enumerate(content)]}


def _part(part: Any, turn: int, index: int, where: str) -> dict[str, Any]:
    """A copy of one content part; an image part may not carry its own image."""
    if not isinstance(part, Mapping) or "type" not in part:
        raise InputError(f"{where}: message {turn} part {index} must be a dict with a 'type'")
    if part["type"] != "image":
        return dict(part)
    carried = [key for key in _PAYLOAD_KEYS if part.get(key) is not None]
    if carried:
        raise InputError(
            f"{where}: message {turn} part {index} is an image part carrying its own {carried[0]!r}; "
            f"put the image in the row's 'image' or 'images' column and leave {{'type': 'image'}} in the "
            f"prompt"
        )
    return {key: value for key, value in part.items() if key not in _PAYLOAD_KEYS}


def _insert_placeholders(messages: list[dict[str, Any]], num_images: int, where: str) -> list[dict[str, Any]]:
    """``num_images`` image parts at the start of the first user message's content."""
    for turn, message in enumerate(messages):
        if message.get("role") == "user":
            placeholders = [{"type": "image"} for _ in range(num_images)]
            messages[turn] = {**message, "content": placeholders + list(message.get("content") or [])}
            return messages
    raise InputError(f"{where}: the prompt has no 'user' message to put its {num_images} image(s) in")


def _short(text: str, limit: int = 120) -> str:
    """``text`` for an error message, cut in the middle when long (a data: URI, a base64 blob)."""
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


def _reason(err: BaseException) -> str:
    return str(err) or type(err).__name__
