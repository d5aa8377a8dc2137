// How an attachment (an image, a video or an audio clip) and what the gateway made of it (POST
// v1/preprocess) are shown: one card per attachment, in the composer before sending and in
// the conversation after.

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

// At most three decimals (as the API rounds seconds), without trailing zeros: a
// container's 29.97002997 fps reads 29.97.
function short(value) {
  return String(Number(value.toFixed(3)));
}

// The rows that say which frames a video's loader picked: how many of how many at what rate,
// and the span of clip they cover.
function frameRows(video) {
  const rows = [];
  if (video.frames) {
    const of = video.total_frames == null ? "" : ` of ${video.total_frames}`;
    const rate = video.fps == null ? "" : ` at ${short(video.fps)} fps`;
    rows.push(["frames", `${video.frames.length}${of}${rate}`]);
  }
  if (video.seconds && video.seconds.length) {
    const first = video.seconds[0];
    const last = video.seconds[video.seconds.length - 1];
    const span = first === last ? short(first) : `${short(first)}–${short(last)}`;
    rows.push(["seconds", `${span} s`]);
  }
  return rows;
}

// A clip's rows: its container, rate, channels and length, as the gateway decoded it.
function audioRows(clip) {
  const channels = clip.channels === 1 ? "mono" : `${clip.channels} channels`;
  return [
    ["format", clip.format || clip.mime || "?"],
    ["decoded", `${clip.sample_rate} Hz, ${channels}`],
    ["duration", `${short(clip.seconds)} s`],
  ];
}

const ITEMS = { image: "images", video: "videos", audio: "audio" };
const FAMILIES = { image: "family", video: "video_family", audio: "audio_family" };

// The rows of the facts list for item `index` of kind "image", "video" or "audio" of a
// /v1/preprocess answer.
export function factRows(reply, index, kind = "image") {
  const item = reply[ITEMS[kind]][index];
  if (reply.processed_by === "worker") {
    const rows = [["processor", "the engine worker's (none for this model in the gateway)"]];
    if (kind === "audio") rows.push(...audioRows(item));
    else rows.push(["type", item.mime || "?"]);
    return rows;
  }
  const family = reply[FAMILIES[kind]];
  // (family_title names the image processor; a video processor of its family shares it)
  const title = kind === "audio" ? null : reply.family_title;
  const rows = [["processor", title ? `${title} (${family})` : `${family}`]];
  if (kind === "audio") rows.push(...audioRows(item));
  else rows.push(["decoded", `${item.width}×${item.height}`]);
  if (kind === "video") rows.push(...frameRows(item));
  for (const [name, values] of Object.entries(item.grid)) rows.push([name, joined(values)]);
  const markers = item.tokens - item.embeddings;
  const tokens = markers > 0 ? `${item.tokens} (${markers} of them markers)` : `${item.tokens}`;
  rows.push(["tokens", tokens]);
  // (a video's too: the API names its frames' patches pixel_values, as they travel; a clip's
  // features are input_features, Qwen2.5-Omni's input_audio_features: its clips' frames)
  for (const name of ["pixel_values", "input_features", "input_audio_features"]) {
    const tensor = item.tensors[name];
    if (tensor) rows.push([name, `[${tensor.shape.join(", ")}] ${tensor.dtype}`]);
  }
  return rows;
}

// A video's preview, from its blob: URL (the CSP's media-src); a clip the browser cannot
// play (an AVI, MPEG-4 Part 2) is said so: the gateway decodes it all the same.
function videoPreview(item) {
  const video = el("video");
  video.src = item.preview;
  video.controls = true;
  video.muted = true;
  video.preload = "metadata";
  video.playsInline = true;
  video.setAttribute("aria-label", item.name);
  video.addEventListener("error", () => {
    video.replaceWith(el("p", "no-preview", "no preview: this browser cannot play it"));
  });
  return video;
}

// A clip's player, from its blob: URL (the CSP's media-src), or a word where the browser
// cannot play it (the gateway decodes it all the same).
function audioPreview(item) {
  const audio = el("audio");
  audio.src = item.preview;
  audio.controls = true;
  audio.preload = "metadata";
  audio.setAttribute("aria-label", item.name);
  audio.addEventListener("error", () => {
    audio.replaceWith(el("p", "no-preview", "no player: this browser cannot play it"));
  });
  return audio;
}

const PREVIEWS = { image: imagePreview, video: videoPreview, audio: audioPreview };

function imagePreview(item) {
  const img = el("img");
  img.src = item.url;
  img.alt = item.name;
  return img;
}

// A card for `item` ({kind, name, url, preview, bytes, facts}): preview, name and size, then
// the facts (or what stands in for them: "asking the gateway…", an error).
export function mediaCard(item) {
  const node = el("li", `card ${item.kind}`);
  const preview = PREVIEWS[item.kind](item);
  const box = el("div", "facts-box");
  node.append(preview, el("span", "name", item.name), el("span", "size", formatBytes(item.bytes)));
  node.append(box);
  const card = {
    node,
    showFacts(reply, index) {
      const list = el("dl", "facts");
      for (const [term, value] of factRows(reply, index, item.kind)) {
        list.append(el("dt", null, term), el("dd", null, value));
      }
      box.replaceChildren(list);
    },
    showStatus(text, isError = false) {
      box.replaceChildren(el("p", isError ? "error" : "facts-status", text));
    },
  };
  if (item.facts) card.showFacts(item.facts, 0);
  else if (item.factsError) card.showStatus(item.factsError, true);
  return card;
}
