// The conversation: what is shown, what is sent (the whole history each turn, as OpenAI's
// chat API takes it), the streamed answer with its usage and timings, and stopping it.

import { ApiError, chatStream } from "./api.js";
import { contentPart, release } from "./attachments.js";
import { el, mediaCard } from "./facts.js";

function userContent(text, media) {
  if (media.length === 0) return text;
  const parts = media.map(contentPart);
  if (text) parts.push({ type: "text", text });
  return parts;
}

// "image 1: ...", "video 0: ..." or "audio 0: ..." in an error names the item by its position
// among the request's items of its kind: say its file. `names`: {image: [...], video: [...]}.
function namingMedia(message, names) {
  const match = /\b(image|video|audio) (\d+)\b/.exec(message);
  const name = match && names[match[1]]?.[Number(match[2])];
  return name ? `${message}\n(${match[1]} ${match[2]} is “${name}”)` : message;
}

export function describeError(error, names = {}) {
  if (!(error instanceof ApiError)) return `The request failed: ${error.message}`;
  const param = error.param ? ` (${error.param})` : "";
  return namingMedia(`Error ${error.status}${param}: ${error.message}`, names);
}

function namesByKind(media) {
  const names = { image: [], video: [], audio: [] };
  for (const item of media) names[item.kind].push(item.name);
  return names;
}

function stats(usage, started, first, ended, finish) {
  const parts = [];
  if (usage) {
    parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
  }
  if (first !== null) parts.push(`first token ${Math.round(first - started)} ms`);
  if (usage && first !== null && usage.completion_tokens > 1 && ended > first) {
    // the decode rate: tokens after the first over the time after the first
    const rate = ((usage.completion_tokens - 1) * 1000) / (ended - first);
    parts.push(`${rate.toFixed(1)} tokens/s`);
  }
  if (finish) parts.push(`finish: ${finish}`);
  return parts.join(" · ");
}

// Runs `update` (which grows the conversation) and keeps the end in view where it was in
// view: in the transcript, which scrolls by itself on wide screens, and in the page.
function followingTheEnd(transcript, update) {
  const scrollers = [transcript, document.scrollingElement];
  const atEnd = scrollers.map((s) => s.scrollHeight - s.scrollTop - s.clientHeight < 48);
  update();
  scrollers.forEach((s, i) => {
    if (atEnd[i]) s.scrollTop = s.scrollHeight;
  });
}

export class Conversation {
  // `context`: model() the served name, settings() the sampling fields and system prompt,
  // onBusy(busy) while an answer streams, onError(error) for errors the page handles.
  constructor(transcript, context) {
    this.transcript = transcript;
    this.context = context;
    this.history = []; // [{message, media}] sent and answered
    this.controller = null;
    this.chat = 0; // which chat this is: a reset starts another
  }

  get busy() {
    return this.controller !== null;
  }

  reset() {
    this.stop();
    this.chat += 1;
    for (const turn of this.history) turn.media.forEach(release);
    this.history = [];
    this.transcript.replaceChildren();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  showUser(text, media) {
    const turn = el("article", "turn user");
    turn.append(el("h2", null, "You"));
    if (media.length) {
      const list = el("ul", "media");
      for (const item of media) {
        item.sent = true; // its preview is shown here from now on
        const card = mediaCard(item);
        list.append(card.node);
        // sent before the gateway had answered about it: show the facts when they come
        if (!item.facts && item.factsReady) {
          item.factsReady.then(() => item.facts && card.showFacts(item.facts, 0));
        }
      }
      turn.append(list);
    }
    if (text) turn.append(el("p", "text", text));
    followingTheEnd(this.transcript, () => this.transcript.append(turn));
  }

  showAssistant() {
    const turn = el("article", "turn assistant");
    turn.setAttribute("aria-busy", "true");
    const reasoning = el("details", "reasoning");
    reasoning.hidden = true;
    reasoning.append(el("summary", null, "Reasoning"));
    const thought = el("p", "text thought");
    reasoning.append(thought);
    const text = el("p", "text answer");
    const stats = el("p", "stats");
    stats.setAttribute("role", "status");
    const error = el("p", "error");
    error.setAttribute("role", "alert");
    turn.append(el("h2", null, "Assistant"), reasoning, text, stats, error);
    followingTheEnd(this.transcript, () => this.transcript.append(turn));
    return { turn, reasoning, thought, text, stats, error };
  }

  // Sends one user turn and streams the answer. Returns false when the API refused it: the
  // turn is then left out of the history (the caller gives it back to the composer to fix).
  async send(text, media) {
    const { model, settings } = this.context;
    const chat = this.chat;
    const { system, ...sampling } = settings();
    const user = { role: "user", content: userContent(text, media) };
    const messages = [
      ...(system ? [{ role: "system", content: system }] : []),
      ...this.history.map((turn) => turn.message),
      user,
    ];
    const names = namesByKind([...this.history.flatMap((turn) => turn.media), ...media]);
    this.showUser(text, media);
    const view = this.showAssistant();
    const body = { model: model(), messages, stream_options: { include_usage: true }, ...sampling };
    this.controller = new AbortController();
    this.context.onBusy(true);
    const started = performance.now();
    let first = null;
    let usage = null;
    let finish = null;
    let answer = "";
    let ok = true;
    try {
      for await (const chunk of chatStream(body, this.controller.signal)) {
        usage = chunk.usage || usage;
        for (const choice of chunk.choices) {
          const delta = choice.delta || {};
          if (delta.content || delta.reasoning) first ??= performance.now();
          followingTheEnd(this.transcript, () => {
            if (delta.reasoning) {
              view.reasoning.hidden = false;
              view.thought.textContent += delta.reasoning;
            }
            if (delta.content) {
              answer += delta.content;
              view.text.textContent = answer;
            }
          });
          finish = choice.finish_reason || finish;
        }
      }
      const line = stats(usage, started, first, performance.now(), finish);
      followingTheEnd(this.transcript, () => (view.stats.textContent = line));
    } catch (error) {
      if (error.name === "AbortError") {
        const ms = Math.round(performance.now() - started);
        const line = `stopped after ${ms} ms (${answer.length} characters)`;
        followingTheEnd(this.transcript, () => (view.stats.textContent = line));
        view.turn.classList.add("stopped");
      } else {
        ok = false;
        const line = describeError(error, names);
        followingTheEnd(this.transcript, () => (view.error.textContent = line));
        this.context.onError(error);
      }
    } finally {
      this.controller = null;
      view.turn.setAttribute("aria-busy", "false");
      this.context.onBusy(false);
    }
    // A stopped answer stays as far as it went; one that never started is left out, so that
    // the next turn does not follow a user turn with another. Nothing is kept of a chat that
    // "New chat" ended meanwhile.
    if (ok && answer && chat === this.chat) {
      this.history.push({ message: user, media });
      this.history.push({ message: { role: "assistant", content: answer }, media: [] });
    }
    return ok;
  }
}
