// The gateway's API as the page uses it: the same OpenAI endpoints any client calls, with
// relative URLs (so the page works behind a proxy that mounts the gateway under a path).

const KEY = "mmgate-api-key";

// An API error as the gateway answered it (OpenAI's {"error": {message, type, param, code}}).
export class ApiError extends Error {
  constructor(status, message, param = null) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

// The API key, when the server asks for one: in this tab's sessionStorage only, never in
// localStorage or a cookie, so it is gone when the tab closes.
export const apiKey = {
  get: () => sessionStorage.getItem(KEY),
  set: (key) => sessionStorage.setItem(KEY, key),
  clear: () => sessionStorage.removeItem(KEY),
};

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey.get();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  let param = null;
  try {
    const body = await response.json();
    if (body && body.error) {
      message = body.error.message || message;
      param = body.error.param ?? null;
    }
  } catch {
    // not JSON: the status line says what there is to say
  }
  return new ApiError(response.status, message, param);
}

async function call(path, init = {}) {
  const response = await fetch(path, { ...init, headers: headers() });
  if (!response.ok) throw await failure(response);
  return response;
}

// GET v1/models: the served model's name (401 when a key is needed, 503 while no worker).
export async function servedModel() {
  const body = await (await call("v1/models")).json();
  return body.data[0].id;
}

// POST v1/preprocess: what the gateway makes of the images and videos of `messages`.
export async function preprocess(model, messages, signal) {
  const init = { method: "POST", body: JSON.stringify({ model, messages }), signal };
  return (await call("v1/preprocess", init)).json();
}

// POST v1/chat/completions with stream: true; yields each server-sent event's JSON. An error
// event (the gateway's way to fail mid-stream) is thrown as an ApiError.
export async function* chatStream(body, signal) {
  const init = { method: "POST", body: JSON.stringify({ ...body, stream: true }), signal };
  const response = await call("v1/chat/completions", init);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) {
        throw new ApiError(chunk.error.code || 500, chunk.error.message, chunk.error.param);
      }
      yield chunk;
    }
  }
}
