"""``grpokit.data.images``: every form a data set holds an image in gives the same RGB pixels; every unusable
image is refused naming the data set, the row and the column; prompts get one ``{"type": "image"}`` part per
image, as TRL's ``prepare_multimodal_messages`` places them. Images are made with PIL in ``tmp_path``."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import datasets
import pytest
from PIL import Image

from grpokit.data.images import IMAGE_COLUMNS, check_image_rows, has_images, row_images, with_image_parts
from grpokit.data.integrity import InputError

WHERE = "train_dataset row 3"


def make_image(mode: str = "RGB", size: tuple[int, int] = (4, 3), seed: int = 0) -> Image.Image:
    """A small image whose every pixel differs, so a transposed or shifted copy would not compare equal."""
    image = Image.new("RGB", size)
    image.putdata(
        [
            ((x * 60 + seed) % 256, (y * 80 + seed) % 256, (x + y * 7 + seed) % 256)
            for y in range(size[1])
            for x in range(size[0])
        ]
    )
    return image if mode == "RGB" else image.convert(mode)


def png_bytes(image: Image.Image, **save_args) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **save_args)
    return buffer.getvalue()


def pixels(image: Image.Image) -> tuple[str, tuple[int, int], bytes]:
    return image.mode, image.size, image.tobytes()


@pytest.fixture
def original() -> Image.Image:
    return make_image()


@pytest.fixture
def png(tmp_path, original) -> Path:
    path = tmp_path / "picture.png"
    path.write_bytes(png_bytes(original))
    return path


# ---------------------------------------------------------------- accepted forms


def accepted_forms(png: Path, original: Image.Image, monkeypatch) -> dict[str, object]:
    monkeypatch.setenv("HOME", str(png.parent))
    data = png.read_bytes()
    return {
        "pil": original,
        "opened pil": Image.open(png),
        "str path": str(png),
        "Path": png,
        "~ str": f"~/{png.name}",
        "~ Path": Path("~") / png.name,
        "bytes": data,
        "bytearray": bytearray(data),
        "dict bytes": {"bytes": data, "path": None},
        "dict path": {"bytes": None, "path": str(png)},
        "dict bytes and a stale path": {"bytes": data, "path": "gone/elsewhere.png"},
    }


@pytest.mark.parametrize("column", IMAGE_COLUMNS)
def test_every_accepted_form_gives_the_same_rgb_pixels(png, original, monkeypatch, column):
    for label, form in accepted_forms(png, original, monkeypatch).items():
        row = {"prompt": "x", column: [form] if column == "images" else form}
        assert has_images(row), label
        [image] = row_images(row, WHERE)
        assert pixels(image) == pixels(original), label
        assert image is not form, label


def test_images_in_order_and_a_single_value_is_a_one_item_list(tmp_path):
    images = [make_image(seed=seed) for seed in (0, 50, 100)]
    paths = []
    for index, image in enumerate(images):
        paths.append(tmp_path / f"{index}.png")
        paths[-1].write_bytes(png_bytes(image))
    got = row_images({"images": [paths[0], images[1], png_bytes(images[2])]}, WHERE)
    assert [pixels(image) for image in got] == [pixels(image) for image in images]
    assert [pixels(image) for image in row_images({"images": paths[1]}, WHERE)] == [pixels(images[1])]
    assert [pixels(image) for image in row_images({"images": tuple(paths[:2])}, WHERE)] == [
        pixels(images[0]),
        pixels(images[1]),
    ]


@pytest.mark.parametrize("mode", ["P", "L", "LA", "RGBA", "1", "CMYK"])
def test_other_modes_come_back_rgb(tmp_path, mode):
    source = make_image(mode)
    expected = pixels(source.convert("RGB"))
    assert pixels(row_images({"image": source}, WHERE)[0]) == expected
    if mode != "CMYK":  # PNG holds no CMYK
        path = tmp_path / f"{mode}.png"
        path.write_bytes(png_bytes(source))
        [image] = row_images({"image": path}, WHERE)
        assert image.mode == "RGB"
        assert pixels(image) == expected


def test_a_palette_image_with_transparency_comes_back_rgb():
    source = make_image("P")
    source.info["transparency"] = 0
    [image] = row_images({"image": png_bytes(source, transparency=0)}, WHERE)
    assert pixels(image) == pixels(source.convert("RGBA").convert("RGB"))


def test_exif_orientation_is_applied_as_datasets_decodes_it(original):
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: datasets' decode transposes it
    data = png_bytes(original, exif=exif)
    decoded = datasets.Image().decode_example({"bytes": data, "path": None})
    [image] = row_images({"image": data}, WHERE)
    assert image.size == (original.height, original.width)
    assert pixels(image) == pixels(decoded.convert("RGB"))
    # A decoded image (its orientation already applied) is not turned a second time.
    assert pixels(row_images({"image": decoded}, WHERE)[0]) == pixels(image)


def test_the_file_is_closed_and_the_pixels_loaded(png, original):
    [image] = row_images({"image": png}, WHERE)
    png.unlink()
    assert pixels(image) == pixels(original)
    assert getattr(image, "fp", None) is None


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"prompt": "x"}, False),
        ({"image": None}, False),
        ({"images": None}, False),
        ({"images": []}, False),
        ({"image": None, "images": []}, False),
        ({"image": "a.png"}, True),
        ({"images": ["a.png"]}, True),
        ({"images": "a.png"}, True),
        ({"images": [None]}, True),  # has an entry: row_images refuses it
    ],
)
def test_has_images(row, expected):
    assert has_images(row) is expected


def test_a_row_without_images_has_none():
    assert row_images({"prompt": "x", "image": None, "images": []}, WHERE) == []


def test_one_column_empty_the_other_used(original):
    assert len(row_images({"image": original, "images": []}, WHERE)) == 1
    assert len(row_images({"image": None, "images": [original, original]}, WHERE)) == 2


# ---------------------------------------------------------------- refusals


def refusal_cases(tmp_path: Path, png: Path) -> dict[str, tuple[object, str]]:
    """label -> (the bad image, a phrase its message holds)."""
    text = tmp_path / "notes.png"
    text.write_text("these are notes, not an image\n")
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    data = png.read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(data[: len(data) // 2])
    big = png_bytes(make_image(size=(64, 64)))
    return {
        "http URL": ("http://example.com/cat.png", "download"),
        "https URL": ("https://example.com/cat.png", "URL"),
        "s3 URL": ("s3://bucket/cat.png", "URL"),
        "URL in a datasets dict": ({"bytes": None, "path": "https://example.com/cat.png"}, "URL"),
        "missing file": (str(tmp_path / "nowhere.png"), "does not exist"),
        "missing file in a datasets dict": (
            {"bytes": None, "path": str(tmp_path / "nowhere.png")},
            "not exist",
        ),
        "a folder": (tmp_path, "is not a file"),
        "a text file named .png": (text, "not a readable image"),
        "an empty file": (empty, "empty"),
        "a truncated file": (cut, "not a readable image"),
        "truncated bytes": (big[: len(big) // 2], "not a readable image"),
        "bytes that are no image": (b"GIF89a but not really", "not a readable image"),
        "empty bytes": (b"", "empty"),
        "empty bytes in a datasets dict": ({"bytes": b"", "path": str(png)}, "empty"),
        "a datasets dict with neither": ({"bytes": None, "path": None}, "neither"),
        "zero width": (Image.new("RGB", (0, 4)), "zero size"),
        "zero height": (Image.new("RGB", (4, 0)), "zero size"),
        "an int": (7, "got int"),
        "a list of pixels": ([[0, 0, 0]], "got list"),
        "a dict of something else": ({"url": "x.png"}, "got dict"),
        "None in the list": (None, "is None"),
    }


def test_every_bad_image_is_refused_naming_the_row_and_column(tmp_path, png, original):
    for label, (bad, phrase) in refusal_cases(tmp_path, png).items():
        with pytest.raises(InputError) as caught:
            row_images({"images": [original, bad]}, WHERE)
        message = str(caught.value)
        assert message.startswith("train_dataset row 3 column 'images'[1]: "), (label, message)
        assert phrase in message, (label, message)
        if bad is not None:
            with pytest.raises(InputError, match=r"^train_dataset row 3 column 'image': "):
                row_images({"image": bad}, WHERE)


def test_a_url_is_not_fetched(monkeypatch):
    import urllib.request

    def no_network(*args, **kwargs):
        raise AssertionError("grpokit fetched a URL")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    with pytest.raises(InputError, match="does not fetch images"):
        row_images({"image": "https://example.com/cat.png"}, WHERE)


def test_a_long_value_is_cut_in_the_message(tmp_path):
    with pytest.raises(InputError) as caught:
        row_images({"image": "data:image/png;base64," + "A" * 10_000}, WHERE)
    assert len(str(caught.value)) < 400


def test_a_row_with_both_columns_is_refused(original):
    with pytest.raises(InputError, match=r"^train_dataset row 3: has both an 'image' and an 'images' column"):
        row_images({"image": original, "images": [original]}, WHERE)


# ---------------------------------------------------------------- prompts: image parts


def test_a_string_content_user_message_gets_the_parts_before_its_text():
    prompt = [{"role": "user", "content": "What is in the picture?"}]
    assert with_image_parts(prompt, 1, WHERE) == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]}
    ]


def test_several_images_go_in_the_first_user_message_after_the_system_message():
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Compare them."},
        {"role": "assistant", "content": "Which two?"},
        {"role": "user", "content": "These."},
    ]
    assert with_image_parts(prompt, 2, WHERE) == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare them."}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Which two?"}]},
        {"role": "user", "content": [{"type": "text", "text": "These."}]},
    ]


def test_no_images_only_structures_the_contents():
    prompt = [{"role": "user", "content": "2+2?"}]
    assert with_image_parts(prompt, 0, WHERE) == [
        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}
    ]


def test_a_structured_prompt_keeps_its_placeholders_when_they_match():
    prompt = [
        {"role": "user", "content": [{"type": "text", "text": "Left:"}, {"type": "image"}]},
        {"role": "user", "content": [{"type": "text", "text": "Right:"}, {"type": "image", "text": None}]},
    ]
    assert with_image_parts(prompt, 2, WHERE) == prompt


def test_a_structured_prompt_without_placeholders_gets_them_at_the_start_of_the_first_user_message():
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Describe."}]}]
    assert with_image_parts(prompt, 1, WHERE) == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe."}]}
    ]


@pytest.mark.parametrize("num_images", [0, 1, 3])
def test_a_placeholder_count_that_differs_is_refused_naming_both_counts(num_images):
    prompt = [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "?"}]}
    ]
    with pytest.raises(InputError) as caught:
        with_image_parts(prompt, num_images, WHERE)
    message = str(caught.value)
    assert message.startswith(WHERE)
    assert "2 image part(s)" in message
    assert f"{num_images} image(s)" in message


def test_a_plain_string_prompt_is_refused():
    with pytest.raises(InputError, match=r"images need a conversational prompt.*a plain string"):
        with_image_parts("What is in the picture?", 1, WHERE)


def test_a_prompt_without_a_user_message_is_refused():
    with pytest.raises(InputError, match="no 'user' message"):
        with_image_parts([{"role": "system", "content": "Look."}], 1, WHERE)


def test_an_image_part_carrying_its_own_image_is_refused(original):
    for payload in ({"image": original}, {"url": "https://example.com/a.png"}, {"path": "a.png"}):
        prompt = [{"role": "user", "content": [{"type": "image", **payload}, {"type": "text", "text": "?"}]}]
        with pytest.raises(InputError, match="message 0 part 0 is an image part carrying its own"):
            with_image_parts(prompt, 1, WHERE)
    # None-valued payload keys (a datasets struct column's union of keys) are dropped, not refused.
    prompt = [{"role": "user", "content": [{"type": "image", "image": None, "text": None}]}]
    assert with_image_parts(prompt, 1, WHERE) == [
        {"role": "user", "content": [{"type": "image", "text": None}]}
    ]


def test_a_malformed_part_is_refused():
    with pytest.raises(InputError, match="message 0 part 1 must be a dict with a 'type'"):
        with_image_parts([{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}], 0, WHERE)


def test_the_input_is_never_mutated():
    prompts = [
        [{"role": "user", "content": "What?"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "t"}]}],
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "t"}]}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [{"id": 1}]}],
    ]
    for prompt in prompts:
        before = copy.deepcopy(prompt)
        result = with_image_parts(prompt, 1, WHERE)
        assert prompt == before
        for message in result:  # the result shares no dict or list with the input
            message["role"] = "changed"
            if isinstance(message["content"], list):
                message["content"].append({"type": "text", "text": "added"})
                message["content"][0]["type"] = "changed"
        assert prompt == before


def test_a_none_content_stays_none():
    prompt = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": []}]
    assert with_image_parts(prompt, 1, WHERE)[1] == {"role": "assistant", "content": None, "tool_calls": []}


def strip_payloads(messages: list[dict]) -> list[dict]:
    """TRL's messages with the image objects it puts in the parts removed."""
    return [
        {
            **message,
            "content": [
                {
                    key: value
                    for key, value in part.items()
                    if not (part["type"] == "image" and key == "image")
                }
                for part in message["content"]
            ]
            if isinstance(message.get("content"), list)
            else message.get("content"),
        }
        for message in messages
    ]


TRL_PROMPTS = [
    ([{"role": "user", "content": "What is in the picture?"}], 1),
    ([{"role": "user", "content": "Compare."}], 3),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What?"}], 1),
    (
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        2,
    ),
    ([{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image"}]}], 1),
    ([{"role": "user", "content": "no images"}], 0),
]


@pytest.mark.parametrize(("prompt", "num_images"), TRL_PROMPTS)
def test_the_parts_match_trls_prepare_multimodal_messages(prompt, num_images, original):
    data_utils = pytest.importorskip("trl.data_utils")
    expected = data_utils.prepare_multimodal_messages(copy.deepcopy(prompt), images=[original] * num_images)
    assert with_image_parts(prompt, num_images, WHERE) == strip_payloads(expected)


# ---------------------------------------------------------------- whole data sets


def conversation(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_check_image_rows_counts_rows_with_images_and_allows_mixed_rows(png, original):
    rows = [
        {"prompt": conversation("a"), "image": png},
        {"prompt": conversation("b"), "image": None},
        {"prompt": "plain text, no image", "image": None},
        {"prompt": conversation("c"), "images": [original, png]},
        {"prompt": conversation("d"), "images": []},
    ]
    before = copy.deepcopy(rows)
    assert check_image_rows(rows, "train_dataset") == 2
    assert rows == before
    assert check_image_rows([{"prompt": "x"}], "train_dataset") == 0
    assert check_image_rows([], "train_dataset") == 0


def test_check_image_rows_refuses_a_broken_image_naming_its_row(tmp_path, png):
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    rows = [
        {"prompt": conversation("a"), "images": [png]},
        {"prompt": conversation("b"), "images": [png, bad]},
    ]
    with pytest.raises(InputError, match=r"^eval_dataset row 1 column 'images'\[1\]: file .*bad\.png"):
        check_image_rows(rows, "eval_dataset")


def test_check_image_rows_refuses_a_count_mismatch_naming_the_prompt(png):
    prompt = [
        {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "?"}]}
    ]
    with pytest.raises(InputError, match=r"^train_dataset row 0 field 'prompt': the prompt has 2 image part"):
        check_image_rows([{"prompt": prompt, "image": png}], "train_dataset")
    with pytest.raises(InputError, match=r"row 0 field 'prompt': .* but the row has 0 image"):
        check_image_rows([{"prompt": prompt}], "train_dataset")


def test_check_image_rows_refuses_images_with_a_plain_string_prompt(png):
    with pytest.raises(
        InputError, match=r"^train_dataset row 0 field 'prompt': images need a conversational"
    ):
        check_image_rows([{"prompt": "Describe it.", "image": png}], "train_dataset")


def test_check_image_rows_refuses_both_columns(png):
    with pytest.raises(InputError, match=r"^train_dataset row 1: has both"):
        check_image_rows(
            [
                {"prompt": conversation("a"), "image": png},
                {"prompt": conversation("b"), "image": png, "images": [png]},
            ],
            "train_dataset",
        )


def test_a_datasets_image_column_decoded_or_not(tmp_path, png, original):
    other = make_image(seed=99)
    message = {"role": datasets.Value("string"), "content": datasets.Value("string")}
    features = datasets.Features({"prompt": datasets.List(message), "image": datasets.Image()})
    ds = datasets.Dataset.from_dict(
        {
            "prompt": [conversation("a"), conversation("b")],
            "image": [str(png), {"bytes": png_bytes(other), "path": None}],
        },
        features=features,
    )
    decoded = [ds[index] for index in range(len(ds))]
    assert all(isinstance(row["image"], Image.Image) for row in decoded)
    undecoded_ds = ds.cast_column("image", datasets.Image(decode=False))
    undecoded = [undecoded_ds[index] for index in range(len(undecoded_ds))]
    assert all(isinstance(row["image"], dict) for row in undecoded)
    assert undecoded[0]["image"]["bytes"] is not None or undecoded[0]["image"]["path"] == str(png)
    for rows in (decoded, undecoded):
        assert check_image_rows(rows, "train_dataset") == 2
        got = [pixels(row_images(row, f"train_dataset row {index}")[0]) for index, row in enumerate(rows)]
        assert got == [pixels(original), pixels(other)]


def test_a_datasets_images_list_column(png, original):
    ds = datasets.Dataset.from_dict({"prompt": [conversation("a")], "images": [[str(png), str(png)]]})
    ds = ds.cast_column("images", datasets.List(datasets.Image()))
    [row] = list(ds)
    assert check_image_rows([row], "train_dataset") == 1
    assert [pixels(image) for image in row_images(row, WHERE)] == [pixels(original)] * 2
    undecoded = ds.cast_column("images", datasets.List(datasets.Image(decode=False)))[0]
    assert [pixels(image) for image in row_images(undecoded, WHERE)] == [pixels(original)] * 2
