// The images and videos of the message being written: added by the file picker, by pasting
// or by dropping files; each shown as a card with its size and what the gateway made of it,
// and a button to remove it before sending. A file that is neither is refused, with a word
// in the page saying which.

import { preprocess } from "./api.js";
import { el, mediaCard } from "./facts.js";

// The types of files that come without one (some systems give none for .mkv, say): the
// gateway takes a data: URI only when it declares image/* or video/*.
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
};

const isMedia = (type) => type.startsWith("image/") || type.startsWith("video/");

// The file's type, from the browser or else from its name; null when neither says image or
// video.
export function mediaType(file) {
  if (isMedia(file.type)) return file.type;
  return BY_EXTENSION[file.name.split(".").pop().toLowerCase()] ?? null;
}

function readAsDataUrl(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

// The item as the API takes it: an image_url or a video_url part.
export function contentPart(item) {
  return item.kind === "video"
    ? { type: "video_url", video_url: { url: item.url } }
    : { type: "image_url", image_url: { url: item.url } };
}

// Lets a video's preview go (its blob: URL holds the file) once it is shown nowhere.
export function release(item) {
  if (item.preview) URL.revokeObjectURL(item.preview);
  item.preview = "";
}

export class Attachments {
  // `list`: the <ul> of cards; `notice`: where refused files are named;
  // `context.model()`: the served model's name; `context.onError(error)`: an API error the
  // page as a whole handles (a missing key).
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

  // Attaches the images and videos of `files`, and says which others were left out.
  async addFiles(files) {
    const refused = [];
    const accepted = [];
    for (const file of files) {
      const type = mediaType(file);
      if (type) accepted.push([file, type]);
      else refused.push(`“${file.name || "a pasted file"}”`);
    }
    this.notice.textContent = refused.length
      ? `Not attached: ${refused.join(", ")}: only images and videos can be.`
      : "";
    for (const [file, type] of accepted) {
      const kind = type.startsWith("video/") ? "video" : "image";
      const item = { kind, name: file.name || `pasted ${kind}`, bytes: file.size, url: "" };
      // (as a Blob of the type found, for a file the browser gave none or another)
      const blob = file.type === type ? file : new Blob([file], { type });
      item.url = await readAsDataUrl(blob);
      // A video is previewed from a blob: URL of the file, not from its data: URI, which is
      // a third larger and would be copied into the <video>.
      if (kind === "video") item.preview = URL.createObjectURL(blob);
      this.add(item);
    }
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
