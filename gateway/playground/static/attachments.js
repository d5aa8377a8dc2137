// The images of the message being written: added by the file picker, by pasting or by
// dropping files; each shown as a card with its size and what the gateway made of it, and a
// button to remove it before sending.

import { preprocess } from "./api.js";
import { el, imageCard } from "./facts.js";

function readAsDataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

export class Attachments {
  // `list`: the <ul> of cards; `context.model()`: the served model's name;
  // `context.onError(error)`: an API error the page as a whole handles (a missing key).
  constructor(list, fallbackFocus, context) {
    this.list = list;
    this.fallbackFocus = fallbackFocus;
    this.context = context;
    this.images = [];
  }

  get count() {
    return this.images.length;
  }

  async addFiles(files) {
    for (const file of files) {
      const image = { name: file.name || "pasted image", bytes: file.size, url: "" };
      image.url = await readAsDataUrl(file);
      this.add(image);
    }
  }

  add(image) {
    this.images.push(image);
    const card = imageCard(image);
    const remove = el("button", "remove", "×");
    remove.type = "button";
    remove.setAttribute("aria-label", `Remove ${image.name}`);
    remove.addEventListener("click", () => this.remove(image, card.node));
    card.node.append(remove);
    this.list.append(card.node);
    if (!image.facts && !image.factsError) image.factsReady = this.lookUp(image, card);
  }

  // Each image on its own, so that a card shows its facts as soon as they are known and a
  // bad image is named by the card it is on.
  async lookUp(image, card) {
    card.showStatus("asking the gateway…");
    const part = { type: "image_url", image_url: { url: image.url } };
    const messages = [{ role: "user", content: [part] }];
    try {
      image.facts = await preprocess(this.context.model(), messages);
      card.showFacts(image.facts, 0);
    } catch (error) {
      image.factsError = `${error.status ? `Error ${error.status}: ` : ""}${error.message}`;
      card.showStatus(image.factsError, true);
      this.context.onError(error);
    }
  }

  remove(image, node) {
    const at = this.images.indexOf(image);
    this.images.splice(at, 1);
    const next = node.nextElementSibling || node.previousElementSibling;
    node.remove();
    // Keyboard users stay where they were: on the next image's remove button, else the prompt.
    (next ? next.querySelector(".remove") : this.fallbackFocus).focus();
  }

  // The images to send, leaving the composer empty.
  take() {
    const taken = this.images;
    this.images = [];
    this.list.replaceChildren();
    return taken;
  }
}
