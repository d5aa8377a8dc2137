// The playground's entry point: finds the page's elements and wires them together (the
// served model, the media it takes and the API key, the settings, the composer's keys, paste,
// drop and recording).

import { apiKey, preprocess, servedModel } from "./api.js";
import { Attachments, DEFAULT_MODALITIES, acceptFor, kindsWord } from "./attachments.js";
import { Conversation, describeError } from "./chat.js";
import { Recorder, canRecord } from "./recorder.js";
import { apiReference } from "./reference.js";

const $ = (id) => document.getElementById(id);
const page = {
  model: $("model"),
  auth: $("auth"),
  authWhy: $("auth-why"),
  key: $("api-key"),
  system: $("system"),
  temperature: $("temperature"),
  maxTokens: $("max-tokens"),
  topP: $("top-p"),
  transcript: $("transcript"),
  composer: $("composer"),
  attachments: $("attachments"),
  refused: $("refused"),
  prompt: $("prompt"),
  file: $("file"),
  attach: $("attach"),
  record: $("record"),
  send: $("send"),
  stop: $("stop"),
  newChat: $("new-chat"),
};
let model = null;
let modalities = DEFAULT_MODALITIES;
const RETRY_MS = 2000;

function number(input) {
  const value = input.valueAsNumber;
  return Number.isFinite(value) ? value : undefined;
}

function settings() {
  return {
    system: page.system.value.trim(),
    temperature: number(page.temperature),
    max_tokens: number(page.maxTokens),
    top_p: number(page.topP),
  };
}

function askForKey(why) {
  page.authWhy.textContent = why;
  page.auth.hidden = false;
  page.key.focus();
}

// Errors any call can meet that concern the page rather than one request.
function onError(error) {
  if (error.status === 401) {
    const refused = apiKey.get() !== null;
    apiKey.clear();
    askForKey(refused ? "That API key was refused." : "This server requires an API key.");
  }
}

// What the picker, the attach button and the record button offer: the media the model takes,
// as the gateway's /v1/preprocess names them (images and videos if it does not say).
function offer(taken) {
  modalities = taken.length ? taken : DEFAULT_MODALITIES;
  page.file.accept = acceptFor(modalities);
  page.attach.textContent = `Add ${kindsWord(modalities)}…`;
  page.record.hidden = !(modalities.includes("audio") && canRecord());
}

async function connect() {
  try {
    model = await servedModel();
    const reply = await preprocess(model, [{ role: "user", content: "hi" }]);
    offer(reply.modalities || []);
    page.model.textContent = `model: ${model}`;
  } catch (error) {
    if (error.status === 401) {
      page.model.textContent = "an API key is needed";
      onError(error);
    } else if (error.status === 503) {
      page.model.textContent = "waiting for an engine worker…";
      setTimeout(connect, RETRY_MS);
    } else {
      page.model.textContent = describeError(error);
    }
  }
}

const attachments = new Attachments(page.attachments, page.refused, page.prompt, {
  model: () => model,
  modalities: () => modalities,
  onError,
});
const recorder = new Recorder();
let ticker = null;
const conversation = new Conversation(page.transcript, {
  model: () => model,
  settings,
  onError,
  onBusy(busy) {
    page.stop.disabled = !busy;
    page.send.disabled = busy;
    // a disabled button loses focus: keep keyboard users in the composer
    if (!busy && document.activeElement === document.body) page.prompt.focus();
  },
});

async function send() {
  const text = page.prompt.value.trim();
  if (conversation.busy || (!text && attachments.count === 0)) return;
  const media = attachments.take();
  page.prompt.value = "";
  const ok = await conversation.send(text, media);
  if (!ok && !page.prompt.value && attachments.count === 0) {
    // refused: give the message back to fix (remove the file the error names, say)
    page.prompt.value = text;
    for (const item of media) attachments.add(item);
  }
}

const filesOf = (list) => [...(list || [])];

page.auth.addEventListener("submit", (event) => {
  event.preventDefault();
  apiKey.set(page.key.value.trim());
  page.key.value = "";
  page.auth.hidden = true;
  page.prompt.focus();
  apiReference($("api"), $("api-routes"));
connect();
});

page.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
page.prompt.addEventListener("keydown", (event) => {
  // Enter sends and Shift+Enter is a new line; Ctrl/Cmd+Enter sends too. Not while an input
  // method is composing a character.
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && conversation.busy) conversation.stop();
});
page.stop.addEventListener("click", () => conversation.stop());
page.newChat.addEventListener("click", () => {
  conversation.reset();
  if (recorder.recording) {
    recorder.cancel();
    showRecording(false);
  }
  page.prompt.focus();
});

page.attach.addEventListener("click", () => page.file.click());

// Record: starts recording (the browser asks for the microphone); pressed again, stops and
// attaches the clip.
function showRecording(on) {
  page.record.classList.toggle("recording", on);
  page.record.setAttribute("aria-pressed", String(on));
  clearInterval(ticker);
  page.record.textContent = on ? "Stop recording (0 s)" : "Record";
  if (on) {
    ticker = setInterval(() => {
      page.record.textContent = `Stop recording (${Math.floor(recorder.seconds)} s)`;
    }, 250);
  }
}

page.record.addEventListener("click", async () => {
  if (!recorder.recording) {
    try {
      await recorder.start();
      showRecording(true);
    } catch (error) {
      page.refused.textContent = `Cannot record: ${error.message}`;
    }
    return;
  }
  showRecording(false);
  try {
    const { blob, type } = await recorder.stop();
    const stamp = new Date().toTimeString().slice(0, 8).replaceAll(":", "");
    await attachments.addBlob(blob, `recording-${stamp}.${type === "audio/wav" ? "wav" : "ogg"}`);
  } catch (error) {
    page.refused.textContent = `The recording could not be kept: ${error.message}`;
  }
});
page.file.addEventListener("change", async () => {
  await attachments.addFiles(filesOf(page.file.files));
  page.file.value = "";
});
document.addEventListener("paste", (event) => {
  const files = filesOf(event.clipboardData && event.clipboardData.files);
  if (files.length === 0) return; // text pastes as usual
  event.preventDefault();
  attachments.addFiles(files);
});
// Files dropped anywhere on the page are attached (rather than opened by the browser).
document.addEventListener("dragover", (event) => {
  event.preventDefault();
  page.composer.classList.add("dropping");
});
document.addEventListener("dragleave", (event) => {
  if (event.relatedTarget === null) page.composer.classList.remove("dropping");
});
document.addEventListener("drop", (event) => {
  event.preventDefault();
  page.composer.classList.remove("dropping");
  attachments.addFiles(filesOf(event.dataTransfer && event.dataTransfer.files));
});

apiReference($("api"), $("api-routes"));
connect();
