// How an image and what the gateway made of it (POST v1/preprocess) are shown: one card per
// image, in the composer before sending and in the conversation after.

export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / 1024 / 1024).toFixed(2)} MB`;
}

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function joined(values) {
  return Array.isArray(values) ? values.flat().join("×") : String(values);
}

// The rows of the facts list for image `index` of a /v1/preprocess answer.
export function factRows(reply, index) {
  const image = reply.images[index];
  if (reply.processed_by === "worker") {
    return [
      ["processor", "the engine worker's (none for this model in the gateway)"],
      ["type", image.mime || "?"],
    ];
  }
  const rows = [
    ["processor", `${reply.family_title} (${reply.family})`],
    ["decoded", `${image.width}×${image.height}`],
  ];
  for (const [name, values] of Object.entries(image.grid)) rows.push([name, joined(values)]);
  const markers = image.tokens - image.embeddings;
  const tokens = markers > 0 ? `${image.tokens} (${markers} of them markers)` : `${image.tokens}`;
  rows.push(["tokens", tokens]);
  const pixels = image.tensors.pixel_values;
  if (pixels) rows.push(["pixel_values", `[${pixels.shape.join(", ")}] ${pixels.dtype}`]);
  return rows;
}

// A card for `image` ({name, url, bytes, facts}): thumbnail, name and size, then the facts
// (or what stands in for them: "asking the gateway…", an error).
export function imageCard(image) {
  const node = el("li", "image");
  const img = el("img");
  img.src = image.url;
  img.alt = image.name;
  const box = el("div", "facts-box");
  node.append(img, el("span", "name", image.name), el("span", "size", formatBytes(image.bytes)));
  node.append(box);
  const card = {
    node,
    showFacts(reply, index) {
      const list = el("dl", "facts");
      for (const [term, value] of factRows(reply, index)) {
        list.append(el("dt", null, term), el("dd", null, value));
      }
      box.replaceChildren(list);
    },
    showStatus(text, isError = false) {
      box.replaceChildren(el("p", isError ? "error" : "facts-status", text));
    },
  };
  if (image.facts) card.showFacts(image.facts, 0);
  else if (image.factsError) card.showStatus(image.factsError, true);
  return card;
}
