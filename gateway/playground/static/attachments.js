// The images, videos and audio clips of the message being written: added by the file picker,
// by pasting or by dropping files (and clips by recording); each shown as a card with its size
// and what the gateway made of it, and a button to remove it before sending. A file of a kind
// the model does not take is refused, with a word in the page saying which.

import { preprocess } from "./api.js";
import { el, mediaCard } from "./facts.js";

// The types of files that come without one (some systems give none for .mkv, say): the
// gateway takes a data: URI only when it declares image/*, video/* or audio/*.
const BY_EXTENSION = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  bmp: "image/bmp",
  tif: "image/tiff",
  tiff: "image/tiff",
  mp4: "video/mp4",
  m4v: "video/mp4",
  mov: "video/quicktime",
  webm: "video/webm",
  mkv: "video/x-matroska",
  avi: "video/x-msvideo",
  wav: "audio/wav",
  flac: "audio/flac",
  mp3: "audio/mpeg",
  ogg: "audio/ogg",
  oga: "audio/ogg",
  opus: "audio/ogg",
};

// What the model takes when the gateway has not said (it answers with its `modalities`).
export const DEFAULT_MODALITIES = ["image", "video"];
const kindOf = (type) => type.split("/")[0];

// The file's type, from the browser or else from its name, when it is of a kind in
// `modalities`; null otherwise.
export function mediaType(file, modalities = DEFAULT_MODALITIES) {
  const byName = BY_EXTENSION[file.name.split(".").pop().toLowerCase()];
  const type = modalities.includes(kindOf(file.type)) ? file.type : byName;
  return type && modalities.includes(kindOf(type)) ? type : null;
}

// The picker's `accept` for `modalities`: "image/*,video/*", ...
export function acceptFor(modalities) {
  return modalities.map((kind) => `${kind}/*`).join(",");
}

// What the page calls the kinds it takes: "images and videos", "audio", ...
export function kindsWord(modalities) {
  const words = modalities.map((kind) => ({ image: "images", video: "videos" })[kind] ?? kind);
  return words.length > 1 ? `${words.slice(0, -1).join(", ")} and ${words.at(-1)}` : words[0];
}

function readAsDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

// input_audio's `format`, as OpenAI's API and vLLM's request model take it: "wav" or "mp3"
// (vLLM sniffs the bytes either way); other clips go as an audio_url data: URI.
const INPUT_AUDIO_FORMATS = {
  "audio/wav": "wav",
  "audio/wave": "wav",
  "audio/x-wav": "wav",
  "audio/mpeg": "mp3",
};

// The item as the API takes it: an image_url, video_url, input_audio or audio_url part.
export function contentPart(item) {
  if (item.kind === "audio") {
    const [head, data] = item.url.split(",", 2);
    const format = INPUT_AUDIO_FORMATS[head.slice(5).split(";")[0]];
    return format
      ? { type: "input_audio", input_audio: { data, format } }
      : { type: "audio_url", audio_url: { url: item.url } };
  }
  return item.kind === "video"
    ? { type: "video_url", video_url: { url: item.url } }
    : { type: "image_url", image_url: { url: item.url } };
}

// Lets a video's or a clip's preview go (its blob: URL holds the file) once it is shown nowhere.
export function release(item) {
  if (item.preview) URL.revokeObjectURL(item.preview);
  item.preview = "";
}

export class Attachments {
  // `list`: the <ul> of cards; `notice`: where refused files are named;
  // `context.model()`: the served model's name; `context.modalities()`: the kinds of media it
  // takes; `context.onError(error)`: an API error the page as a whole handles (a missing key).
  constructor(list, notice, fallbackFocus, context) {
    this.list = list;
    this.notice = notice;
    this.fallbackFocus = fallbackFocus;
    this.context = context;
    this.items = [];
  }

  get count() {
    return this.items.length;
  }

  // Attaches the media of `files` the model takes, and says which others were left out.
  async addFiles(files) {
    const modalities = this.context.modalities();
    const refused = [];
    const accepted = [];
    for (const file of files) {
      const type = mediaType(file, modalities);
      if (type) accepted.push([file, type]);
      else refused.push(`“${file.name || "a pasted file"}”`);
    }
    this.notice.textContent = refused.length
      ? `Not attached: ${refused.join(", ")}: only ${kindsWord(modalities)} can be.`
      : "";
    for (const [file, type] of accepted) {
      // (as a Blob of the type found, for a file the browser gave none or another)
      const blob = file.type === type ? file : new Blob([file], { type });
      await this.addBlob(blob, file.name);
    }
  }

  // Attaches one image, video or audio clip (a file, or a recording).
  async addBlob(blob, name) {
    const kind = kindOf(blob.type);
    const item = { kind, name: name || `pasted ${kind}`, bytes: blob.size, url: "" };
    item.url = await readAsDataUrl(blob);
    // A video or a clip is played from a blob: URL of the file, not from its data: URI, which
    // is a third larger and would be copied into the player.
    if (kind !== "image") item.preview = URL.createObjectURL(blob);
    this.add(item);
  }

  add(item) {
    this.items.push(item);
    const card = mediaCard(item);
    const remove = el("button", "remove", "×");
    remove.type = "button";
    remove.setAttribute("aria-label", `Remove ${item.name}`);
    remove.addEventListener("click", () => this.remove(item, card.node));
    card.node.append(remove);
    this.list.append(card.node);
    if (!item.facts && !item.factsError) item.factsReady = this.lookUp(item, card);
  }

  // Each item on its own, so that a card shows its facts as soon as they are known and a
  // bad file is named by the card it is on.
  async lookUp(item, card) {
    card.showStatus("asking the gateway…");
    const messages = [{ role: "user", content: [contentPart(item)] }];
    try {
      item.facts = await preprocess(this.context.model(), messages);
      card.showFacts(item.facts, 0);
    } catch (error) {
      item.factsError = `${error.status ? `Error ${error.status}: ` : ""}${error.message}`;
      card.showStatus(item.factsError, true);
      this.context.onError(error);
    }
  }

  remove(item, node) {
    const at = this.items.indexOf(item);
    this.items.splice(at, 1);
    // (one sent and refused still shows in its turn above)
    if (!item.sent) release(item);
    const next = node.nextElementSibling || node.previousElementSibling;
    node.remove();
    // Keyboard users stay where they were: on the next item's remove button, else the prompt.
    (next ? next.querySelector(".remove") : this.fallbackFocus).focus();
  }

  // The items to send, leaving the composer empty.
  take() {
    const taken = this.items;
    this.items = [];
    this.list.replaceChildren();
    this.notice.textContent = "";
    return taken;
  }
}
