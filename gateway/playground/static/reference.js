// The API reference: every route of this gateway, read from its own /openapi.json (made
// from the one route table, so the list is never out of date), with what each one does.

const METHOD_ORDER = ["POST", "GET", "DELETE"];

function operations(document) {
  const out = [];
  for (const [path, methods] of Object.entries(document.paths || {})) {
    for (const [method, operation] of Object.entries(methods)) {
      out.push({ method: method.toUpperCase(), path, summary: operation.summary || "" });
    }
  }
  const rank = (op) => METHOD_ORDER.indexOf(op.method);
  return out.sort((a, b) => a.path.localeCompare(b.path) || rank(a) - rank(b));
}

function row(op) {
  const item = document.createElement("li");
  const method = document.createElement("span");
  method.className = `method ${op.method.toLowerCase()}`;
  method.textContent = op.method;
  const path = document.createElement("code");
  path.textContent = op.path;
  const summary = document.createElement("span");
  summary.className = "summary";
  summary.textContent = op.summary;
  item.append(method, " ", path, " ", summary);
  return item;
}

// Fill `list` the first time `details` opens (the document is not fetched before it is read).
export function apiReference(details, list) {
  let loaded = false;
  details.addEventListener("toggle", async () => {
    if (!details.open || loaded) return;
    loaded = true;
    try {
      const response = await fetch("openapi.json");
      if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
      list.replaceChildren(...operations(await response.json()).map(row));
    } catch (error) {
      loaded = false;
      const item = document.createElement("li");
      item.className = "error";
      item.textContent = `The API document could not be read: ${error.message}`;
      list.replaceChildren(item);
    }
  });
}
