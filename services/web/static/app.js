// The Memory tab's one script. An element marked data-api (a form, or a button outside one)
// is sent to the JSON API as the call a client would make: its method, X-Agent / X-Tenant
// from itself or its nearest marked ancestor, a JSON body of the form's fields, signed by
// the web session's cookie and this page's CSRF token. On success the page reloads.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]')?.content || "";

  function say(text, isError) {
    const el = document.getElementById("status");
    if (!el) return;
    el.textContent = text;
    el.className = isError ? "status error" : "status ok";
  }

  function bodyOf(el) {
    const body = {};
    if (el.tagName !== "FORM") return body;
    for (const [name, value] of new FormData(el)) {
      if (typeof value === "string" && value !== "") body[name] = value;
    }
    return body;
  }

  function inherited(el, name) {
    return el.closest(`[data-${name}]`)?.dataset[name] || "";
  }

  // What a preview answered (an undo's plan), said in the status line instead of reloading.
  function planOf(answer) {
    const n = (answer.changes || []).length, deps = answer.dependents || [];
    let text = n ? `Would take back changes to ${n} record${n === 1 ? "" : "s"}.` : "Nothing to undo.";
    if (deps.length) text += ` Later writes depend on it: ${deps.join("; ")}.`;
    if (answer.members_records_left) text += ` ${answer.members_records_left} records naming a member stay.`;
    return text;
  }

  async function send(el, preview) {
    if (!preview && el.dataset.confirm && !window.confirm(el.dataset.confirm)) return;
    const method = (el.dataset.method || "POST").toUpperCase();
    const headers = { "Accept": "application/json", "X-CSRF-Token": csrf };
    const agent = inherited(el, "agent"), tenant = inherited(el, "tenant");
    if (agent) headers["X-Agent"] = agent;
    if (tenant) headers["X-Tenant"] = tenant;
    const init = { method, headers, credentials: "same-origin" };
    const body = bodyOf(el);
    if (preview) body.preview = true;
    if (method !== "GET" && method !== "DELETE" && Object.keys(body).length) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const buttons = el.tagName === "FORM" ? el.querySelectorAll("button") : [el];
    buttons.forEach((b) => { b.disabled = true; });
    say(el.dataset.busy || "Working…", false);
    try {
      const res = await fetch(el.dataset.api, init);
      const answer = await res.json().catch(() => ({}));
      if (!res.ok) {
        const err = answer.error || {};
        say(`${err.message || res.statusText} (${err.code || res.status})`, true);
        return;
      }
      if (preview) {
        say(planOf(answer), false);
        return;
      }
      say(el.dataset.done || "Done.", false);
      window.location.reload();
    } catch (e) {
      say(`The server did not answer (${e}); check that memlane serve is running, then try again.`, true);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
  }

  // The one edit dialog, filled from the row whose Edit button opened it.
  function openEditor(button) {
    const dialog = document.getElementById("edit");
    const row = button.closest("tr");
    const form = dialog.querySelector("form");
    form.dataset.api = `/v1/memory/${encodeURIComponent(button.dataset.edit)}`;
    form.elements.summary.value = row.querySelector(".summary").textContent;
    form.elements.content.value = row.querySelector(".content")?.textContent || "";
    dialog.showModal();
    form.elements.summary.focus();
  }

  document.addEventListener("submit", (ev) => {
    const form = ev.target.closest("form[data-api]");
    if (!form) return;
    ev.preventDefault();
    send(form, ev.submitter?.hasAttribute("data-preview"));
  });

  document.addEventListener("click", (ev) => {
    const button = ev.target.closest("button");
    if (!button || button.type === "submit") return;
    if (button.dataset.edit) openEditor(button);
    else if (button.hasAttribute("data-close")) button.closest("dialog").close();
    else if (button.dataset.api) send(button);
  });
})();
