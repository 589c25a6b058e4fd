"""`roctune serve` with images: OpenAI `image_url` parts (data URLs) through the official `openai` client on a tiny
SmolVLM-layout model with a LoRA adapter on its language model and vision side; answers equal generate()'s, whole
and streamed, and every image the server does not take is a 400 naming the part."""
from __future__ import annotations

import pytest

from vision_models import picture


@pytest.fixture(scope="module")
def vlm_server(tiny_vlm_dir, vlm_lora_dir):
    import openai

    from roctune.data.images import ImageLimits
    from roctune.serve import ServerThread, Settings, build_engine, create_app
    from roctune.serve.images import ImageSettings

    engine = build_engine(tiny_vlm_dir, [("tuned", vlm_lora_dir)], device="cpu", dtype="fp32", max_batch=4)
    limits = ImageLimits(max_bytes=20 << 20, max_pixels=128 * 128)
    settings = Settings(images=ImageSettings(max_images=2, limits=limits))
    engine.start()
    try:
        with ServerThread(create_app(engine, settings)) as url:
            yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0), engine
    finally:
        engine.stop()


def _ask(url: str, text: str = "What colour?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def test_a_data_url_image_is_answered_as_generate_answers_it(vlm_server, vlm_lora_dir):
    from roctune.data.images import data_url
    from roctune.generate import generate, load_for_inference

    client, _ = vlm_server
    messages = _ask(data_url(picture()))
    whole = client.chat.completions.create(model="tuned", messages=messages, max_tokens=6, temperature=0)
    stream = client.chat.completions.create(model="tuned", messages=messages, max_tokens=6, temperature=0,
                                            stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    loaded = load_for_inference(vlm_lora_dir, device="cpu", dtype="fp32")
    want = generate(loaded, [[{"role": "user", "content": [{"type": "image", "image": picture()},
                                                           {"type": "text", "text": "What colour?"}]}]],
                    max_new_tokens=6)[0]
    assert whole.choices[0].message.content.strip() == streamed.strip() == want
    assert whole.usage.prompt_tokens > 20  # the picture's 20 image tokens are counted
    text_only = client.chat.completions.create(model="tuned", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3, temperature=0)
    assert text_only.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("content, message", [
    ([{"type": "image_url", "image_url": {"url": "http://example.com/a.png"}}], "a URL of scheme http:"),
    ([{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}], "a URL of scheme file:"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "not an image (no format Pillow reads)"),
    ([{"type": "image_url", "image_url": {"url": "BIG"}}], "more than roctune reads (16,384 pixels)"),
    ([{"type": "image_url", "image_url": {"url": "SMALL"}}] * 3, "more than 2 images (--max-images)"),
    ([{"type": "input_audio", "input_audio": {}}], "only text and image_url parts"),
])
def test_images_the_server_does_not_take_are_a_400(vlm_server, content, message):
    import openai

    from roctune.data.images import data_url

    urls = {"BIG": data_url(picture(size=256)), "SMALL": data_url(picture(size=16))}
    for part in content:
        if part.get("image_url", {}).get("url") in urls:
            part["image_url"] = {"url": urls[part["image_url"]["url"]]}
    client, _ = vlm_server
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tuned", messages=[{"role": "user", "content": content}], max_tokens=2)
    assert e.value.status_code == 400 and message in e.value.body["message"]


def test_an_image_to_a_text_only_model_is_a_400():
    from roctune.serve.errors import ApiError
    from roctune.serve.images import Budget
    from roctune.serve.schemas import parse_messages

    with pytest.raises(ApiError) as e:
        parse_messages(_ask("data:image/png;base64,AAAA"), Budget(None, "SmolLM2-135M-Instruct"))
    assert e.value.status == 400 and e.value.code == "images_unsupported"
    assert "model 'SmolLM2-135M-Instruct' is text-only" in e.value.message


def test_responses_take_input_image_parts(vlm_server):
    """POST /v1/responses: an input_image part (a data URL) is the chat endpoint's image, under its rules."""
    import openai

    from roctune.data.images import data_url

    client, _ = vlm_server
    content = [{"type": "input_image", "image_url": data_url(picture())}, {"type": "input_text", "text": "What colour?"}]
    answer = client.responses.create(model="tuned", input=[{"role": "user", "content": content}], max_output_tokens=6,
                                     temperature=0)
    chat = client.chat.completions.create(model="tuned", messages=_ask(data_url(picture())), max_tokens=6,
                                          temperature=0)
    assert answer.output_text.strip() == chat.choices[0].message.content.strip()
    assert answer.usage.input_tokens == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="a URL of scheme https: - nothing is fetched"):
        client.responses.create(model="tuned", input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}], max_output_tokens=2)
