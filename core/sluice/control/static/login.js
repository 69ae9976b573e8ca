// The login page: trades the one-time code in the address's fragment (#code=..., which no server sees),
// or the token typed into the form, for a session cookie, then opens the session's dashboard.
"use strict";

async function login(body) {
  const r = await fetch("/login", {
    method: "POST",
    credentials: "same-origin",
    headers: { "X-Sluice-Request": "1", "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const answer = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(answer.error || r.status + " " + r.statusText);
  location.replace(answer.dashboard);
}

function failed(e) {
  const p = document.getElementById("message");
  p.textContent = "Not logged in: " + e.message;
  p.className = "error";
  document.body.dataset.failed = "1";
}

function fromAddress() {
  const code = new URLSearchParams(location.hash.slice(1)).get("code");
  if (code) {
    history.replaceState(null, "", "/login"); // the used code leaves the address bar and the history
    delete document.body.dataset.failed;
    login({ code }).catch(failed);
  }
}

fromAddress();
window.addEventListener("hashchange", fromAddress); // a new address that differs in its #code only
document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  login({ token: event.target.elements.token.value }).catch(failed);
});
