"""The web playground in a real browser (headless Chromium driven by Selenium,
tests/support/browser.py) against the real gateway over a real worker (the tiny Qwen2-VL on
vLLM's CPU engine): images attached by picker, paste and drop with what the gateway made of
each, a video with the frames its loader picked and its preview, other files refused by name,
audio (on the tiny Qwen2-Audio, preprocessed by the gateway and, with `--mm-processing worker`,
by the worker) attached as a WAV file or recorded from Chromium's fake microphone, each with its
player and facts, and answered by the model alike down both paths,
streamed answers with their usage, stopping one (the engine lets the request go), the API
reference made from the gateway's own OpenAPI document, the API's errors, the keyboard alone,
a phone's width, the API key. After every test, no request of the page went anywhere but the
gateway and the console shows no error but the API's.

Set MMGATE_PLAYGROUND_SCREENSHOT=PATH to keep the screenshot of the first test (the README's
docs/playground.png is made so).
"""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import time
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

from protos import vllm_engine_pb2 as pb
from tests.support import IMAGES_DIR
from tests.support.browser import FAKE_MICROPHONE, Browser
from tests.support.e2e_cases import QWEN2VL_CONTEXT, make_image, png_bytes
from tests.support.engines import WorkerProcess
from tests.support.gateway_process import GatewayProcess
from tests.support.video_e2e import make_clip, video

MODEL = "tiny-qwen2-vl"
PHOTO = IMAGES_DIR / "square.jpg"
QUESTION = "What is in this picture?"
SYSTEM = "You are a careful observer."
# Room for an answer long enough to be stopped half-way (the tiny model rarely ends early).
CONTEXT = QWEN2VL_CONTEXT  # the session worker's max_model_len
LONG_ANSWER = 1900
STATS = re.compile(
    r"(\d+) prompt \+ (\d+) completion tokens · first token \d+ ms · [\d.]+ tokens/s"
    r" · finish: (\w+)"
)


@pytest.fixture(scope="module")
def worker(qwen2vl_worker):
    """The session's plain Qwen2-VL worker (tests/e2e/gateway/conftest.py), CONTEXT long."""
    return qwen2vl_worker


@pytest.fixture(scope="module")
def gateway(vision_model, worker, tmp_path_factory):
    log = tmp_path_factory.mktemp("playground") / "gateway.log"
    gateway = GatewayProcess(vision_model, [worker.address], log, "--served-model-name", MODEL)
    yield gateway.wait_ready()
    gateway.stop()


@pytest.fixture(scope="module")
def browser():
    # (a fake microphone for the recording test; no other test asks for one)
    browser = Browser(flags=FAKE_MICROPHONE)
    yield browser
    browser.quit()


@pytest.fixture
def page(browser, gateway):
    """The playground, freshly loaded and connected to the gateway."""
    open_page(browser, gateway.base_url)
    yield browser
    assert_stayed_local(browser, gateway.base_url)


def open_page(browser: Browser, base_url: str, model: str = MODEL) -> None:
    browser.driver.get(base_url + "/")
    browser.wait(lambda d: text_of(browser, "#model") == f"model: {model}", what="connected")


def assert_stayed_local(browser: Browser, base_url: str) -> None:
    # (chrome:, about:, data: and blob: URLs are the browser's own, never on the network)
    for url in browser.requests():
        if url.split(":", 1)[0] in ("http", "https", "ws", "wss", "ftp"):
            assert url.startswith(base_url + "/"), f"the page asked for {url}"
    # The API's refusals (a 400, a 401) are logged as failed loads; anything else is a fault
    # of the page (a script error, a CSP violation).
    errors = [e for e in browser.console_errors() if "status of 40" not in e]
    assert errors == []


# ---- reading and driving the page ----


def find(browser: Browser, css: str):
    from selenium.webdriver.common.by import By

    return browser.driver.find_element(By.CSS_SELECTOR, css)


def find_all(browser: Browser, css: str) -> list:
    from selenium.webdriver.common.by import By

    return browser.driver.find_elements(By.CSS_SELECTOR, css)


def text_of(browser: Browser, css: str) -> str:
    return (
        browser.js(
            "const e = document.querySelector(arguments[0]); return e && e.textContent;", css
        )
        or ""
    )


def set_field(browser: Browser, field_id: str, value: object) -> None:
    field = find(browser, f"#{field_id}")
    field.clear()
    field.send_keys(str(value))


def attach(browser: Browser, *paths: Path) -> None:
    find(browser, "#file").send_keys("\n".join(str(p) for p in paths))


def facts(card) -> dict[str, str]:
    """A card's facts list as {term: value}."""
    from selenium.webdriver.common.by import By

    terms = [e.get_attribute("textContent") for e in card.find_elements(By.TAG_NAME, "dt")]
    values = [e.get_attribute("textContent") for e in card.find_elements(By.TAG_NAME, "dd")]
    return dict(zip(terms, values))


def composer_cards(browser: Browser, count: int, ready: str = ".facts, .error") -> list:
    """The composer's `count` cards (images and videos), once each shows its facts (or an
    error)."""

    def settled(_):
        cards = find_all(browser, "#attachments .card")
        done = len(cards) == count and all(c.find_elements("css selector", ready) for c in cards)
        return cards if done else False

    return browser.wait(settled, what=f"{count} image cards with facts")


def answer_done(browser: Browser, turn: int = -1) -> str:
    """The stats line of an assistant turn once it has ended (usage, or stopped)."""

    def ended(_):
        turns = find_all(browser, ".turn.assistant")
        if not turns or turns[turn].get_attribute("aria-busy") != "false":
            return False
        return turns[turn].find_element("css selector", ".stats").get_attribute("textContent")

    return browser.wait(ended, what="the answer to end")


def data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def tokenized(gateway: GatewayProcess, content: list[dict], system: str | None = None) -> int:
    messages = [{"role": "system", "content": system}] if system else []
    body = {"messages": [*messages, {"role": "user", "content": content}]}
    return httpx.post(f"{gateway.base_url}/tokenize", json=body, timeout=30).json()["count"]


def record_answer_lengths(browser: Browser) -> None:
    """From now on, the page notes the last answer's length at every change (in the page
    itself, so that no change is missed between two calls of the driver)."""
    browser.js(
        """
        window.lengths = [];
        new MutationObserver(() => {
          const turns = document.querySelectorAll('.turn.assistant .answer');
          const last = turns[turns.length - 1];
          if (last) window.lengths.push(last.textContent.length);
        }).observe(document.getElementById('transcript'),
                   { subtree: true, childList: true, characterData: true });
        """
    )


# ---- the tests ----


def test_an_image_and_a_question_stream_an_answer_with_its_usage(page, gateway, tmp_path):
    find(page, "#system").send_keys(SYSTEM)
    set_field(page, "max-tokens", 40)
    set_field(page, "temperature", 0)
    attach(page, PHOTO)
    (card,) = composer_cards(page, 1)
    # What the gateway made of the image, as its /v1/preprocess tells any client.
    content = [image_part(data_uri(PHOTO, "image/jpeg"))]
    body = {"messages": [{"role": "user", "content": content}]}
    reply = httpx.post(f"{gateway.base_url}/v1/preprocess", json=body, timeout=30).json()
    (image,) = reply["images"]
    shown = facts(card)
    assert shown["processor"] == "Qwen-VL (qwen_vl)"
    assert shown["decoded"] == "256×256"
    assert shown["tokens"] == str(image["tokens"])
    assert shown["image_grid_thw"] == "×".join(map(str, image["grid"]["image_grid_thw"]))
    assert (
        shown["pixel_values"]
        == f"[{', '.join(map(str, image['tensors']['pixel_values']['shape']))}] uint8"
    )
    assert "square.jpg" in card.text and f"{PHOTO.stat().st_size / 1024:.1f} KB" in card.text

    find(page, "#prompt").send_keys(QUESTION)
    record_answer_lengths(page)
    find(page, "#send").click()
    stats = answer_done(page)
    # Streamed: the answer was seen at several lengths before its last.
    lengths = [n for n in page.js("return window.lengths") if n > 0]
    assert len(set(lengths)) >= 3, lengths
    usage = STATS.fullmatch(stats)
    assert usage, stats
    # The prompt the page sent is the one /tokenize counts for the same messages.
    question = [*content, {"type": "text", "text": QUESTION}]
    assert int(usage[1]) == tokenized(gateway, question, system=SYSTEM)
    assert (int(usage[2]), usage[3]) == (40, "length")
    assert text_of(page, ".turn.assistant .answer")
    # The sent turn keeps the image with its facts.
    assert facts(find(page, ".turn.user .image"))["tokens"] == str(image["tokens"])
    shot = tmp_path / "playground.png"
    page.driver.save_screenshot(str(shot))
    if target := os.environ.get("MMGATE_PLAYGROUND_SCREENSHOT"):
        shutil.copy(shot, target)


def preprocessed(gateway: GatewayProcess, content: list[dict]) -> dict:
    body = {"messages": [{"role": "user", "content": content}]}
    reply = httpx.post(f"{gateway.base_url}/v1/preprocess", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def preview_of(browser: Browser, css: str) -> list | None:
    """A <video>'s source scheme and the size the browser decoded, once it has read the
    clip's metadata (None before)."""
    return browser.js(
        """
        const v = document.querySelector(arguments[0]);
        if (!v || v.readyState < 1) return null;
        return [v.src.split(':')[0], v.videoWidth, v.videoHeight];
        """,
        css,
    )


def test_a_video_shows_the_frames_picked_and_is_chatted_about(page, gateway, tmp_path):
    # 11 frames at 6 fps, WebM (VP8): a clip Chromium itself plays, so its preview shows.
    clip = make_clip(tmp_path, "clip.webm", 11, (100, 62), 6, "VP80", seed=7)
    set_field(page, "max-tokens", 8)
    attach(page, tmp_path / "clip.webm")
    (card,) = composer_cards(page, 1)
    assert "video" in card.get_attribute("class").split()
    assert "clip.webm" in card.text and f"{len(clip) / 1024:.1f} KB" in card.text
    # What the gateway made of the clip, as its /v1/preprocess tells any client.
    uri = "data:video/webm;base64," + base64.b64encode(clip).decode()
    reply = preprocessed(gateway, [video(uri)])
    assert reply["processed_by"] == "gateway" and reply["images"] == []
    (clip_facts,) = reply["videos"]
    picked, seconds = clip_facts["frames"], clip_facts["seconds"]
    assert clip_facts["fps"] == 6 and 1 < len(picked) <= clip_facts["total_frames"]
    shown = facts(card)
    assert shown["processor"] == f"Qwen-VL ({reply['video_family']})"
    assert shown["decoded"] == f"{clip_facts['width']}×{clip_facts['height']}"
    assert shown["frames"] == f"{len(picked)} of {clip_facts['total_frames']} at 6 fps"
    assert shown["seconds"] == f"{seconds[0]:g}–{seconds[-1]:g} s"
    grid = clip_facts["grid"]["video_grid_thw"]
    assert shown["video_grid_thw"] == "×".join(map(str, grid))
    assert shown["tokens"] == str(clip_facts["tokens"])
    pixels = clip_facts["tensors"][
        "pixel_values"
    ]  # (the frames' patches, as the worker takes them)
    assert shown["pixel_values"] == f"[{', '.join(map(str, pixels['shape']))}] uint8"
    # Previewed from a blob: URL, which the page's CSP lets a <video> load (a refusal would
    # be a console error, which the fixture's check after the test does not let pass).
    shape = page.wait(lambda _: preview_of(page, "#attachments video"), what="the preview")
    assert shape == ["blob", 100, 62]

    find(page, "#prompt").send_keys("What happens in this clip?")
    find(page, "#send").click()
    usage = STATS.fullmatch(answer_done(page))
    assert usage, usage
    # The page sent the clip as a video_url part, before its question: the prompt the engine
    # counted is the one the gateway expands for those parts.
    question = [video(uri), {"type": "text", "text": "What happens in this clip?"}]
    assert int(usage[1]) == preprocessed(gateway, question)["prompt_tokens"]
    assert (int(usage[2]), usage[3]) == (8, "length")
    # The sent turn keeps the video, its facts and its preview.
    assert facts(find(page, ".turn.user .video"))["frames"] == shown["frames"]
    assert page.wait(lambda _: preview_of(page, ".turn.user video"), what="preview") == shape


def test_files_that_are_not_images_or_videos_are_refused_by_name(page, gateway, tmp_path):
    # A dropped file with no type is taken by its name (.mkv: a Matroska video; the gateway
    # reads the container from the bytes), one of a type neither image nor video is refused.
    clip = make_clip(tmp_path, "clip.webm", 5, (48, 32), 4, "VP80", seed=3)
    # Qwen2-VL takes no audio: a clip is refused too, the picker offers none, nothing records.
    dropped = {
        "notes.txt": b"hello",
        "clip.mkv": clip,
        "tone.wav": wav_bytes(0.2),
        "report.pdf": b"%PDF",
    }
    page.dispatch_files("drop", "#transcript", dropped)
    (card,) = composer_cards(page, 1, ready=".facts")
    assert card.find_element("css selector", ".name").text == "clip.mkv"
    assert facts(card)["frames"].endswith(" at 4 fps")
    refused = find(page, "#refused")
    assert refused.is_displayed() and refused.get_attribute("role") == "alert"
    assert refused.text == (
        "Not attached: “notes.txt”, “report.pdf”, “tone.wav”: only images and videos can be."
    )
    assert find(page, "#file").get_attribute("accept") == "image/*,video/*"
    assert not find(page, "#record").is_displayed()
    # A later pick of images and videos only clears the notice.
    attach(page, PHOTO)
    composer_cards(page, 2, ready=".facts")
    assert text_of(page, "#refused") == "" and not refused.is_displayed()


def test_a_bad_video_shows_the_apis_error_naming_it(page, gateway, tmp_path):
    clip = make_clip(tmp_path, "clip.webm", 5, (48, 32), 4, "VP80", seed=4)
    broken = tmp_path / "broken.webm"
    broken.write_bytes(clip[:300])  # a WebM header, its frames cut off
    set_field(page, "max-tokens", 8)
    attach(page, PHOTO, broken)
    good, bad = composer_cards(page, 2)
    assert "processor" in facts(good)
    assert "Error 400: invalid video: video 0: " in bad.find_element("css selector", ".error").text
    find(page, "#prompt").send_keys("What is wrong here?")
    find(page, "#send").click()
    error = page.wait(lambda _: text_of(page, ".turn.assistant .error"), what="the error")
    # The API's own words, and the file they mean (the first video, after an image).
    uri = "data:video/webm;base64," + base64.b64encode(broken.read_bytes()).decode()
    content = [image_part(data_uri(PHOTO, "image/jpeg")), video(uri)]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
    refused = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert message.startswith("invalid video: video 0: ")
    assert error == f"Error 400 (messages): {message}\n(video 0 is “broken.webm”)"


def loads(worker) -> int:
    """Requests the worker's vLLM engine holds (its own count of unfinished requests)."""
    return worker.stub().GetLoads(pb.GetLoadsRequest()).loads[0].num_total_reqs


def calls_in_flight(gateway: GatewayProcess) -> int:
    workers = httpx.get(f"{gateway.base_url}/admin/workers", timeout=10).json()["workers"]
    return sum(w["calls_in_flight"] for w in workers)


def test_stop_ends_the_answer_and_the_engine_lets_the_request_go(page, gateway, worker):
    from selenium.webdriver.common.keys import Keys

    set_field(page, "max-tokens", LONG_ANSWER)
    set_field(page, "temperature", 1)
    # Stopped by the button, then (the next turn) by Esc.
    turn = 0
    for stop in [lambda: find(page, "#stop").click(), lambda: keys(page, Keys.ESCAPE)]:
        turn = start_a_long_answer(page, worker, turn)
        assert loads(worker) == 1 and calls_in_flight(gateway) == 1
        stop()
        deadline = time.monotonic() + 10
        while (loads(worker), calls_in_flight(gateway)) != (0, 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (loads(worker), calls_in_flight(gateway)) == (0, 0)
        assert worker.stub().GetServerInfo(pb.GetServerInfoRequest()).active_requests == 0
        assert answer_done(page, turn).startswith("stopped after ")
        length = len(answer_text(page, turn))
        time.sleep(0.3)
        assert len(answer_text(page, turn)) == length  # nothing more arrives
        assert find(page, "#stop").get_attribute("disabled") and find(page, "#send").is_enabled()
        turn += 1


def start_a_long_answer(page: Browser, worker, turn: int) -> int:
    """Asks for a long answer until one is still running once it has started, and returns its
    turn: at temperature 1 the random model can sample its EOS among the first tokens, and an
    answer that ended by itself is not what the stop is tested on."""
    from selenium.webdriver.common.keys import Keys

    for _ in range(5):
        find(page, "#prompt").send_keys("Tell me a very long story.", Keys.ENTER)
        page.wait(lambda _, turn=turn: answer_text(page, turn), what="the answer to start")
        if loads(worker) == 1:
            return turn
        answer_done(page, turn)  # ended by itself: let its turn close, then ask again
        turn += 1
    raise AssertionError("five long answers in a row ended as soon as they started")


def answer_text(browser: Browser, turn: int) -> str:
    return browser.js(
        "const a = document.querySelectorAll('.turn.assistant .answer')[arguments[0]];"
        "return a ? a.textContent : '';",
        turn,
    )


def keys(browser: Browser, *sequence: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser.driver).send_keys(*sequence).perform()


def test_a_bad_image_shows_the_apis_error_naming_it(page, gateway, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(png_bytes(make_image(80, 60, seed=1))[:200])
    set_field(page, "max-tokens", 8)
    attach(page, PHOTO, broken)
    good, bad = composer_cards(page, 2)
    assert "processor" in facts(good)
    assert "Error 400: invalid image: image 0: " in bad.find_element("css selector", ".error").text
    find(page, "#prompt").send_keys("What is wrong here?")
    find(page, "#send").click()
    error = page.wait(lambda _: text_of(page, ".turn.assistant .error"), what="the error")
    # The API's own words, and the file they mean.
    content = [image_part(data_uri(PHOTO, "image/jpeg")), image_part(data_uri(broken, "image/png"))]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
    refused = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert message.startswith("invalid image: image 1: ")
    assert error == f"Error 400 (messages): {message}\n(image 1 is “broken.png”)"
    # The message comes back to the composer to fix: remove the bad image and send again.
    assert find(page, "#prompt").get_attribute("value") == "What is wrong here?"
    composer_cards(page, 2)
    find(page, "[aria-label='Remove broken.png']").click()
    composer_cards(page, 1)
    find(page, "#send").click()
    assert STATS.fullmatch(answer_done(page))


def focused(browser: Browser) -> str:
    return browser.js(
        "const e = document.activeElement;"
        "return e.id || e.getAttribute('aria-label') || e.textContent.trim() || e.tagName;"
    )


def test_the_keyboard_alone_sends_and_goes_on(page, gateway):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    def chord(modifier: str, key: str) -> None:
        ActionChains(page.driver).key_down(modifier).send_keys(key).key_up(modifier).perform()

    order = []
    for _ in range(9):
        keys(page, Keys.TAB)
        order.append(focused(page))
    assert order == [
        "new-chat",
        "Settings",
        "system",
        "temperature",
        "max-tokens",
        "top-p",
        "prompt",
        "attach",
        "send",
    ]
    for _ in range(4):
        chord(Keys.SHIFT, Keys.TAB)
    assert focused(page) == "max-tokens"
    chord(Keys.CONTROL, "a")
    keys(page, "8", Keys.TAB, Keys.TAB)
    assert focused(page) == "prompt"
    keys(page, "Hello")
    chord(Keys.SHIFT, Keys.ENTER)  # a new line, not a send
    keys(page, "there")
    assert find(page, "#prompt").get_attribute("value") == "Hello\nthere"
    assert not find_all(page, ".turn")
    keys(page, Keys.ENTER)
    first = STATS.fullmatch(answer_done(page))
    assert first and int(first[2]) == 8
    assert [t.text for t in find_all(page, ".turn.user .text")] == ["Hello\nthere"]
    assert focused(page) == "prompt"  # ready for the next turn
    keys(page, "And then?")
    chord(Keys.CONTROL, Keys.ENTER)
    second = STATS.fullmatch(answer_done(page, turn=1))
    assert second
    # The second turn carried the first (multi-turn): its prompt is the whole conversation.
    answer = text_of(page, ".turn.assistant .answer")
    conversation = [
        {"role": "user", "content": "Hello\nthere"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And then?"},
    ]
    reply = httpx.post(f"{gateway.base_url}/tokenize", json={"messages": conversation}, timeout=30)
    assert int(second[1]) == reply.json()["count"]
    # "New chat" starts over, and leaves the keyboard in the composer.
    for _ in range(6):
        chord(Keys.SHIFT, Keys.TAB)
    assert focused(page) == "new-chat"
    keys(page, Keys.ENTER)
    assert not find_all(page, ".turn") and focused(page) == "prompt"


def test_paste_drop_and_picker_attach_several_images_each_removable(page, gateway):
    pasted = png_bytes(make_image(64, 48, seed=2))
    page.dispatch_files("paste", "#prompt", {"pasted.png": pasted})
    page.dispatch_files("drop", "#transcript", {"dropped.jpg": PHOTO.read_bytes()})
    attach(page, IMAGES_DIR / "wide.jpg")
    cards = composer_cards(page, 3, ready=".facts")
    names = [c.find_element("css selector", ".name").text for c in cards]
    assert names == ["pasted.png", "dropped.jpg", "wide.jpg"]
    assert [facts(c)["decoded"] for c in cards] == ["64×48", "256×256", "500×120"]
    assert f"{len(pasted)} B" in cards[0].text or f"{len(pasted) / 1024:.1f} KB" in cards[0].text
    find(page, "[aria-label='Remove dropped.jpg']").click()
    composer_cards(page, 2)
    assert focused(page) == "Remove wide.jpg"  # focus stays among the images
    set_field(page, "max-tokens", 8)
    find(page, "#prompt").send_keys("Compare them.")
    find(page, "#send").click()
    usage = STATS.fullmatch(answer_done(page))
    sent = find_all(page, ".turn.user .image")
    assert [c.find_element("css selector", ".name").text for c in sent] == [
        "pasted.png",
        "wide.jpg",
    ]
    content = [
        image_part("data:image/png;base64," + base64.b64encode(pasted).decode()),
        image_part(data_uri(IMAGES_DIR / "wide.jpg", "image/jpeg")),
        {"type": "text", "text": "Compare them."},
    ]
    assert usage and int(usage[1]) == tokenized(gateway, content)


def test_readable_at_a_phones_width(browser, gateway):
    metrics = {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}
    browser.driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        open_page(browser, gateway.base_url)
        attach(browser, IMAGES_DIR / "wide.jpg")
        composer_cards(browser, 1)
        # Nothing wider than the screen: no sideways scrolling, every control within reach.
        assert browser.js("return document.documentElement.scrollWidth") <= 390
        for css in ("#send", "#attach", "#prompt", ".image", "#temperature"):
            box = browser.js(
                "return document.querySelector(arguments[0]).getBoundingClientRect().right", css
            )
            assert box <= 390, css
        assert_stayed_local(browser, gateway.base_url)
    finally:
        browser.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def test_the_api_reference_lists_every_route_of_the_gateway(page, gateway):
    document = httpx.get(f"{gateway.base_url}/openapi.json", timeout=30).json()
    expected = sorted(
        f"{method.upper()} {path}" for path, ops in document["paths"].items() for method in ops
    )
    assert {"POST /v1/chat/completions", "GET /v1/responses/{response_id}"} <= set(expected)
    find(page, "#api summary").click()
    rows = page.wait(lambda d: find_all(page, "#api-routes li") or None, what="the routes listed")
    listed = sorted(" ".join(row.text.split()[:2]) for row in rows)
    assert listed == expected


def test_the_api_key_is_asked_for_and_kept_in_the_tab_only(browser, vision_model, worker, tmp_path):
    from selenium.webdriver.common.keys import Keys

    key = "playground-secret"
    keyed = GatewayProcess(
        vision_model,
        [worker.address],
        tmp_path / "gateway.log",
        "--api-key",
        key,
        "--served-model-name",
        MODEL,
    ).wait_ready()
    try:
        browser.driver.get(keyed.base_url + "/")
        browser.wait(lambda _: find(browser, "#auth").is_displayed(), what="the key asked for")
        assert focused(browser) == "api-key"
        assert text_of(browser, "#model") == "an API key is needed"
        find(browser, "#api-key").send_keys("wrong", Keys.ENTER)
        browser.wait(lambda _: "refused" in text_of(browser, "#auth-why"), what="a refusal")
        assert browser.js("return sessionStorage.getItem('mmgate-api-key')") is None
        find(browser, "#api-key").send_keys(key, Keys.ENTER)
        browser.wait(lambda _: text_of(browser, "#model") == f"model: {MODEL}", what="connected")
        assert not find(browser, "#auth").is_displayed()
        # Kept for this tab's session only: not in localStorage, not in a cookie.
        assert browser.js("return sessionStorage.getItem('mmgate-api-key')") == key
        assert browser.js("return [localStorage.length, document.cookie]") == [0, ""]
        set_field(browser, "max-tokens", 4)
        find(browser, "#prompt").send_keys("Hi", Keys.ENTER)
        assert STATS.fullmatch(answer_done(browser))
        assert_stayed_local(browser, keyed.base_url)
    finally:
        keyed.stop()


# ---- audio: the tiny Qwen2-Audio, preprocessed by the gateway or by the worker ----

AUDIO_MODEL = "tiny-qwen2-audio"
SOUND_QUESTION = "What do you hear?"


@pytest.fixture(scope="module")
def audio_model(tmp_path_factory):
    from tests.support.qwen2_audio_models import build_model

    return build_model(tmp_path_factory.mktemp("qwen2-audio") / "model")


@pytest.fixture(scope="module")
def audio_worker(audio_model, tmp_path_factory):
    """A worker that preprocesses media too (`mmgate engine --mm-processor inprocess`): it takes
    the gateway's tensors and, from a gateway with `--mm-processing worker`, the clips."""
    log = tmp_path_factory.mktemp("playground-audio-worker") / "worker.log"
    engine = {"max_model_len": 2048, "limit_mm_per_prompt": {"audio": 2}}
    worker = WorkerProcess(audio_model, log, mm_processor="inprocess", **engine)
    try:
        yield worker.wait_ready()
    finally:
        worker.stop()


def _audio_gateway(audio_model, audio_worker, tmp_path_factory, mode: str):
    log = tmp_path_factory.mktemp(f"playground-audio-{mode}") / "gateway.log"
    args = ("--served-model-name", AUDIO_MODEL, "--mm-processing", mode)
    gateway = GatewayProcess(audio_model, [audio_worker.address], log, *args)
    try:
        yield gateway.wait_ready()
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def audio_gateway(audio_model, audio_worker, tmp_path_factory):
    """As served by default (auto): the gateway has Qwen2-Audio's audio processor and makes
    the clips' tensors itself (equal to vLLM's: tests/e2e/gateway/test_family_audio.py)."""
    yield from _audio_gateway(audio_model, audio_worker, tmp_path_factory, "auto")


@pytest.fixture(scope="module")
def audio_worker_gateway(audio_model, audio_worker, tmp_path_factory):
    """`--mm-processing worker`: the worker preprocesses the clips the gateway checked."""
    yield from _audio_gateway(audio_model, audio_worker, tmp_path_factory, "worker")


AUDIO_GATEWAYS = {"gateway": "audio_gateway", "worker": "audio_worker_gateway"}


@pytest.fixture
def audio_page(browser, audio_gateway):
    open_page(browser, audio_gateway.base_url, AUDIO_MODEL)
    record_chat_bodies(browser)
    yield browser
    assert_stayed_local(browser, audio_gateway.base_url)


@pytest.fixture(params=list(AUDIO_GATEWAYS))
def audio_path(request, browser):
    """(who preprocesses, the page, its gateway): the playground on each audio gateway."""
    gateway = request.getfixturevalue(AUDIO_GATEWAYS[request.param])
    open_page(browser, gateway.base_url, AUDIO_MODEL)
    record_chat_bodies(browser)
    yield request.param, browser, gateway
    assert_stayed_local(browser, gateway.base_url)


def wav_bytes(seconds: float, rate: int = 16000) -> bytes:
    """A 16-bit mono WAV of a tone under a little noise, made with numpy."""
    t = np.arange(round(seconds * rate)) / rate
    samples = 0.3 * np.sin(2 * np.pi * 330 * t) + 0.02 * np.random.default_rng(5).standard_normal(
        t.size
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((samples * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def record_chat_bodies(browser: Browser) -> None:
    """From now on, the page keeps the body of every chat request it sends (window.sent)."""
    browser.js(
        """
        window.sent = [];
        const original = window.fetch;
        window.fetch = (url, init) => {
          if (String(url).endsWith('chat/completions')) window.sent.push(JSON.parse(init.body));
          return original(url, init);
        };
        """
    )


def sent_audio_part(browser: Browser) -> dict:
    """The audio part of the last chat request the page sent."""
    (body,) = browser.js("return window.sent")
    part, question = body["messages"][-1]["content"]
    assert question == {"type": "text", "text": SOUND_QUESTION}
    return part


def player_of(browser: Browser, css: str) -> list | None:
    """An <audio>'s source scheme and its length, once it has read the clip's metadata."""
    return browser.js(
        """
        const a = document.querySelector(arguments[0]);
        if (!a || a.readyState < 1) return null;
        return [a.src.split(':')[0], a.duration];
        """,
        css,
    )


def ask_about_the_clip(page: Browser) -> tuple[str, re.Match]:
    set_field(page, "max-tokens", 8)
    set_field(page, "temperature", 0)
    find(page, "#prompt").send_keys(SOUND_QUESTION)
    find(page, "#send").click()
    usage = STATS.fullmatch(answer_done(page))
    assert usage, usage
    return text_of(page, ".turn.assistant .answer"), usage


def assert_the_model_answered_that_clip(gateways, part: dict, answer: str, usage) -> None:
    """The same request through the API of each gateway, the one preprocessing the clip and
    the one leaving it to the worker: the same prompt (the clip expanded alike) and the same
    greedy answer as the page showed."""
    content = [part, {"type": "text", "text": SOUND_QUESTION}]
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 8,
        "temperature": 0,
    }
    for gateway in gateways:
        reply = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["prompt_tokens"] == int(usage[1])
        assert reply.json()["choices"][0]["message"]["content"] == answer


# What a card shows of the 1.25 s 16 kHz clip below, by who preprocesses it: the gateway's
# processor and tensors ((L-1)//2+1-2)//2+1 = 31 tokens for its L = 125 mel frames, and a
# [128, 3000] input_features, the 30 s window, in the float32 the CPU engine takes), or the
# worker's; the clip's own facts either way.
CLIP_FACTS = {"format": "wav", "decoded": "16000 Hz, mono", "duration": "1.25 s"}
AUDIO_CARDS = {
    "gateway": {
        "processor": "qwen2_audio",
        **CLIP_FACTS,
        "tokens": "31",
        "input_features": "[128, 3000] float32",
    },
    "worker": {
        "processor": "the engine worker's (none for this model in the gateway)",
        **CLIP_FACTS,
    },
}


def test_an_audio_file_is_attached_with_a_player_and_answered(
    audio_path, audio_gateway, audio_worker_gateway, tmp_path
):
    who, page, _ = audio_path
    # The model takes audio only: the picker and the button say so, and it can record.
    assert find(page, "#file").get_attribute("accept") == "audio/*"
    assert find(page, "#attach").text == "Add audio…"
    assert find(page, "#record").is_displayed()
    path = tmp_path / "tone.wav"
    path.write_bytes(wav_bytes(1.25))
    attach(page, path)
    (card,) = composer_cards(page, 1)
    assert "audio" in card.get_attribute("class").split()
    assert facts(card) == AUDIO_CARDS[who]
    assert "tone.wav" in card.text and f"{path.stat().st_size / 1024:.1f} KB" in card.text
    scheme, seconds = page.wait(lambda _: player_of(page, "#attachments audio"), what="player")
    assert scheme == "blob" and abs(seconds - 1.25) < 0.01

    answer, usage = ask_about_the_clip(page)
    # Sent as an input_audio part of the file's very bytes, as OpenAI's API and vLLM take it.
    part = sent_audio_part(page)
    data = base64.b64encode(path.read_bytes()).decode()
    assert part == {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    assert_the_model_answered_that_clip((audio_gateway, audio_worker_gateway), part, answer, usage)
    # The sent turn keeps the clip, its facts and its player.
    assert facts(find(page, ".turn.user .audio")) == AUDIO_CARDS[who]
    assert page.wait(lambda _: player_of(page, ".turn.user audio"), what="player")[0] == "blob"


def test_a_recording_from_the_microphone_reaches_the_model(
    audio_page, audio_gateway, audio_worker_gateway
):
    page = audio_page
    record = find(page, "#record")
    record.click()
    page.wait(lambda _: record.get_attribute("aria-pressed") == "true", what="recording")
    time.sleep(2.0)
    assert re.fullmatch(r"Stop recording \(\d s\)", record.text)
    record.click()
    (card,) = composer_cards(page, 1)
    assert record.text == "Record" and record.get_attribute("aria-pressed") == "false"
    name = card.find_element("css selector", ".name").text
    # Chromium records WebM only, which the gateway does not take: the page made it a WAV.
    assert re.fullmatch(r"recording-\d{6}\.wav", name), name
    shown = facts(card)
    assert shown["format"] == "wav" and shown["decoded"].endswith(" Hz, mono")
    recorded = float(shown["duration"].removesuffix(" s"))
    assert 1.5 < recorded < 4.0, shown
    assert page.wait(lambda _: player_of(page, "#attachments audio"), what="player")[0] == "blob"

    answer, usage = ask_about_the_clip(page)
    part = sent_audio_part(page)
    assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    raw = base64.b64decode(part["input_audio"]["data"])
    with wave.open(io.BytesIO(raw)) as clip:
        rate, frames = clip.getframerate(), clip.readframes(clip.getnframes())
    samples = np.frombuffer(frames, "<i2") / 32768
    assert f"{rate} Hz" in shown["decoded"]
    assert abs(samples.size / rate - recorded) < 0.002
    # The gateway preprocessed it: ((L-1)//2+1-2)//2+1 tokens for L = its 10 ms mel frames at
    # 16 kHz, after resampling (torchaudio's length: ceil(samples x 16000 / rate)).
    frames = ceil_div(ceil_div(samples.size * 16000, rate), 160)
    assert shown["processor"] == "qwen2_audio"
    assert shown["tokens"] == str(((frames - 1) // 2 + 1 - 2) // 2 + 1)
    assert shown["input_features"] == "[128, 3000] float32"
    # Not silence: the fake microphone's tone and beeps were recorded.
    assert np.abs(samples).max() > 0.05
    assert_the_model_answered_that_clip((audio_gateway, audio_worker_gateway), part, answer, usage)
