// shop.js — the buyer page of a holdfast sale, plain JavaScript with no build
// step and nothing from elsewhere. It takes the SKU from ?sku=, signs the
// buyer in (config.json says how: make dev's dev issuer, or an OpenID Connect
// provider's authorization code flow with PKCE), counts down to opens_at by
// the server's clock (server_time), joins the waiting room, polls the public,
// cacheable queue state each second and fetches its own ticket only when its
// turn came, once after the opening to learn its place (spread over a few
// seconds by the queue's length), or when its place seems lost; it hears
// SOLD_OUT, units coming back, the close and a room turned off from the public
// state alone. It buys with the admission token and follows the reservation to
// its end. Every state shows in #state's data-state, which tests read;
// api/openapi.yaml describes the routes.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  let sku = new URLSearchParams(location.search).get("sku") || "";
  // SOLD_OUT ends the buyer's part unless units come back: a room's page
  // keeps watching the public state for them while the sale is open.
  const terminal = new Set(["CONFIRMED", "PAID", "CANCELLED", "SOLD_OUT", "EXPIRED", "CLOSED", "RESERVED"]);

  let config = {};
  let token = "", user = "";
  let offset = 0; // the server's clock minus ours, in ms
  let opensAt = null, closesAt = null, waitingRoom = true;
  let ticket = "", position = 0, admission = null;
  let state = "LOADING";
  let polling = false, fetchingTicket = false, joinTimer = 0;
  let saleOver = false; // the public state said the sale closed: nothing to watch
  let newest = 0, through = 0, longest = 0; // of the public state read so far
  let lookTimer = 0;

  // --- what the page shows -------------------------------------------------

  function setState(s, msg) {
    state = s;
    $("state").dataset.state = s;
    $("state").textContent = s.replace("_", " ");
    if (msg !== undefined) note(msg);
    $("join").hidden = !(s === "COUNTDOWN" && waitingRoom);
    $("buy").hidden = !(s === "ADMITTED" || s === "OPEN");
    $("buy").disabled = false;
    $("admission").hidden = s !== "ADMITTED";
    // Sold out is no unit left (no need to ask, each waiter at the sell-out).
    if (s === "SOLD_OUT") $("available").textContent = "0";
    else if (terminal.has(s) && token) refreshAvailable();
    tick();
    if (watching() && !polling) poll();
  }

  // watching says whether the page polls the public queue state: a room's
  // page before its turn, or sold out (units may come back), until the close.
  const watching = () => waitingRoom && !saleOver && (state === "COUNTDOWN" || state === "WAITING" || state === "SOLD_OUT");

  async function refreshAvailable() {
    const r = await call("GET", "/skus/" + encodeURIComponent(sku));
    if (r.status === 200) $("available").textContent = String(r.body.available);
  }

  function note(msg) { $("message").textContent = msg || ""; }

  function show(id, attr, value, text) {
    const el = $(id);
    el.dataset[attr] = value === null || value === undefined ? "" : String(value);
    el.textContent = text;
  }

  const serverNow = () => Date.now() + offset;

  function duration(ms) {
    const s = Math.ceil(ms / 1000);
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    const two = (n) => String(n).padStart(2, "0");
    return (h > 0 ? h + ":" + two(m) : String(m)) + ":" + two(r);
  }

  // tick redraws what moves with the clock: the countdown and the admission's time left.
  function tick() {
    const now = serverNow();
    if (opensAt !== null && now < opensAt) {
      show("countdown", "remainingMs", opensAt - now, "in " + duration(opensAt - now));
    } else {
      show("countdown", "remainingMs", 0, opensAt === null ? "open" : "opened");
    }
    if (state === "ADMITTED" && admission) {
      const left = admission.expires - now;
      $("admission").textContent = left > 0 ? "Your turn: buy within " + duration(left) + "." : "Your turn has passed.";
      if (left <= 0 && !fetchingTicket) fetchTicket(); // the server says what became of it
    }
    if (state === "COUNTDOWN" && !waitingRoom && opensAt !== null && now >= opensAt) setState("OPEN");
  }

  function showQueue(q) {
    if (q.admitted_through !== undefined) {
      show("admitted-through", "admittedThrough", q.admitted_through, String(q.admitted_through));
    }
    if (q.length !== undefined) show("length", "length", q.length, String(q.length));
    if (q.opens_at !== undefined) opensAt = Date.parse(q.opens_at);
    if (q.closes_at !== undefined) closesAt = Date.parse(q.closes_at);
  }

  function showPosition() {
    if (position > 0) show("position", "position", position, "#" + position);
    else show("position", "position", "", ticket ? "drawn at the opening" : "—");
  }

  // --- talking to the API --------------------------------------------------

  // call fetches an API route; the answer's server_time sets the clock when
  // the answer is fresh (sync), which the public queue state, cached for a
  // second, is not.
  async function call(method, path, opts = {}) {
    const headers = Object.assign({}, opts.headers || {});
    if (opts.auth !== false) headers["Authorization"] = "Bearer " + token;
    if (opts.body !== undefined) headers["Content-Type"] = "application/json";
    const t0 = Date.now();
    let resp;
    try {
      resp = await fetch(path, { method, headers, body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
    } catch (e) {
      return { status: 0, body: { error: "network", message: String(e) }, headers: new Headers() };
    }
    const t1 = Date.now();
    let body = {};
    try { body = await resp.json(); } catch (e) { body = {}; }
    if (opts.sync !== false && body && body.server_time) offset = Date.parse(body.server_time) - (t0 + t1) / 2;
    if (resp.status === 401) signOut("Your sign-in has expired: sign in again.");
    return { status: resp.status, body, headers: resp.headers };
  }

  const retryAfter = (r) => Math.max(1, Number(r.headers.get("Retry-After")) || 1) * 1000;
  const store = (k, v) => { if (v) sessionStorage.setItem(k, v); else sessionStorage.removeItem(k); };
  const key = (what) => "holdfast." + what + "." + user + "." + sku;

  // --- signing in ----------------------------------------------------------

  function showSignIn(msg) {
    $("signin").hidden = false;
    $("sale").hidden = true;
    $("signin-note").textContent = msg || "";
    setState("SIGNED_OUT");
  }

  function signOut(msg) {
    token = "";
    store("holdfast.token", "");
    showSignIn(msg);
  }

  function claims(jwt) {
    try {
      const p = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(atob(p));
    } catch (e) { return {}; }
  }

  async function signIn(ev) {
    ev.preventDefault();
    if (config.sign_in === "dev") {
      const sub = $("user").value.trim();
      const r = await call("POST", config.token_url || "/dev/token", { auth: false, body: { sub } });
      if (r.status !== 200 || !r.body.token) {
        $("signin-note").textContent = "Sign-in failed: " + (r.body.message || r.body.error || r.status);
        return;
      }
      signedIn(r.body.token);
    } else if (config.sign_in === "oidc") {
      await authorize();
    }
  }

  function signedIn(jwt) {
    token = jwt;
    user = String(claims(jwt)[config.user_claim || "sub"] || "");
    store("holdfast.token", jwt);
    start();
  }

  const b64url = (bytes) => btoa(String.fromCharCode(...new Uint8Array(bytes))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");

  // authorize sends the buyer to the identity provider (authorization code
  // flow with PKCE, a public client: no secret lives in the page).
  async function authorize() {
    const verifier = b64url(crypto.getRandomValues(new Uint8Array(32)));
    const nonce = b64url(crypto.getRandomValues(new Uint8Array(16)));
    const challenge = b64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
    sessionStorage.setItem("holdfast.oidc", JSON.stringify({ verifier, nonce, sku }));
    const u = new URL(config.authorize_url);
    u.search = new URLSearchParams({
      response_type: "code", client_id: config.client_id, redirect_uri: location.origin + location.pathname,
      scope: config.scope || "openid", state: nonce, code_challenge: challenge, code_challenge_method: "S256",
    }).toString();
    location.assign(u.toString());
  }

  // redeem finishes authorize's round trip: the code for the tokens.
  async function redeem(q) {
    const saved = JSON.parse(sessionStorage.getItem("holdfast.oidc") || "{}");
    sessionStorage.removeItem("holdfast.oidc");
    history.replaceState(null, "", location.pathname + "?sku=" + encodeURIComponent(saved.sku || ""));
    if (!saved.verifier || q.get("state") !== saved.nonce) return "the sign-in answer does not match this tab";
    const resp = await fetch(config.token_endpoint, {
      method: "POST", headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({
        grant_type: "authorization_code", code: q.get("code"), client_id: config.client_id,
        redirect_uri: location.origin + location.pathname, code_verifier: saved.verifier,
      }),
    }).catch(() => null);
    const body = resp && resp.ok ? await resp.json().catch(() => ({})) : {};
    const jwt = body[config.token || "access_token"];
    if (!jwt) return "the identity provider gave no token";
    signedIn(jwt);
    return "";
  }

  // --- the sale ------------------------------------------------------------

  async function start() {
    $("signin").hidden = true;
    $("sale").hidden = false;
    $("who").textContent = user;
    setState("LOADING", "");
    const r = await call("GET", "/skus/" + encodeURIComponent(sku));
    if (r.status === 401) return;
    if (r.status !== 200) return setState("ERROR", r.status === 404 ? "No such product: " + sku : "Cannot load " + sku + ": " + (r.body.message || r.status));
    opensAt = r.body.opens_at ? Date.parse(r.body.opens_at) : null;
    closesAt = r.body.closes_at ? Date.parse(r.body.closes_at) : null;
    waitingRoom = r.body.waiting_room === true;
    $("available").textContent = String(r.body.available);
    ticket = sessionStorage.getItem(key("ticket")) || "";
    const id = sessionStorage.getItem(key("reservation"));
    if (id) return follow({ reservation_id: id, status: "HELD" });
    if (closesAt !== null && serverNow() >= closesAt) return setState("CLOSED");
    if (!waitingRoom) return setState(opensAt !== null && serverNow() < opensAt ? "COUNTDOWN" : "OPEN");
    showPosition();
    if (ticket) {
      setState("WAITING");
      await fetchTicket();
    } else {
      setState("COUNTDOWN");
    }
  }

  // join takes a ticket; before the queue opens (a while before the sale)
  // it tries again when the server says the queue opens.
  async function join() {
    clearTimeout(joinTimer);
    $("join").disabled = true;
    const r = await call("POST", "/skus/" + encodeURIComponent(sku) + "/queue", { body: {} });
    $("join").disabled = false;
    if (r.status === 200) return applyTicket(r.body);
    const e = r.body.error;
    if (r.status === 409 && e === "queue_not_open") {
      const at = Date.parse(r.body.queue_opens_at);
      note("The queue opens " + new Date(at).toLocaleTimeString() + "; you will be queued then.");
      joinTimer = setTimeout(join, Math.max(retryAfter(r), at - serverNow()));
    } else if (r.status === 409 && e === "sale_closed") {
      setState("CLOSED", "The sale has closed.");
    } else if (r.status === 404 && e === "no_waiting_room") {
      waitingRoom = false;
      setState(opensAt !== null && serverNow() < opensAt ? "COUNTDOWN" : "OPEN");
    } else if (r.status === 429 || r.status === 503 || r.status === 0) {
      note("Busy; trying again shortly.");
      joinTimer = setTimeout(join, r.status === 0 ? 1000 : retryAfter(r));
    } else if (r.status !== 401) {
      note("Could not join: " + (r.body.message || e || r.status));
    }
  }

  // applyTicket shows a ticket's answer (POST queue, GET ticket).
  function applyTicket(b) {
    ticket = b.ticket || ticket;
    store(key("ticket"), ticket);
    position = b.position || 0;
    showQueue(b);
    showPosition();
    switch (b.status) {
      case "WAITING":
        note(b.may_return ? "Sold out for now: units may still come back." : "");
        return setState("WAITING");
      case "ADMITTED":
        // A join that admits answers no token (the ticket's look has it):
        // wait as for one's turn, which has come, and ask for the ticket.
        if (!b.admission_token) { setState("WAITING"); return fetchTicket(); }
        admission = { token: b.admission_token, expires: Date.parse(b.admission_expires_at) };
        return setState("ADMITTED", "");
      case "RESERVED":
        return setState("RESERVED", "This ticket already bought.");
      case "EXPIRED":
        return setState("EXPIRED", "Your turn passed unused.");
      case "SOLD_OUT":
        return setState("SOLD_OUT", "Sold out.");
      case "CLOSED":
        return setState("CLOSED", "The sale has closed.");
    }
    setState("ERROR", "Unexpected ticket status " + b.status);
  }

  async function fetchTicket() {
    if (!ticket || fetchingTicket) return;
    fetchingTicket = true;
    const r = await call("GET", "/skus/" + encodeURIComponent(sku) + "/queue/" + encodeURIComponent(ticket));
    fetchingTicket = false;
    if (r.status === 200) return applyTicket(r.body);
    if (r.status === 404 && r.body.error === "unknown_ticket") {
      ticket = "";
      store(key("ticket"), "");
      position = 0;
      showPosition();
      setState("COUNTDOWN", "Your place was lost: join again.");
    }
  }

  // nextPoll is how long to wait before reading the public queue state
  // again: it is cached for a second from its server_time (the CDN's
  // max-age), so until just after it refreshes, plus up to 200 ms so that
  // one edge's waiters do not arrive at once; 100 ms to a second. An answer
  // seen before (a cache that keeps it longer) waits the full second.
  let seen = "";
  function nextPoll(q) {
    const made = Date.parse(q.server_time || "");
    const fresh = !isNaN(made) && q.server_time !== seen;
    seen = q.server_time || "";
    if (!fresh) return 1000;
    return Math.min(1000, Math.max(100, made + 1000 + Math.random() * 200 - serverNow()));
  }

  // A waiter that does not know its place (the opening drew it, or units
  // came back after it heard SOLD_OUT) asks for its ticket once, at a random
  // moment spread so that the queue's waiters ask about lookRate a second (at
  // most spreadMax): not every waiter within the second the opening shows.
  const lookRate = 2000, spreadMax = 30000;
  const spread = (n) => Math.random() * Math.min(spreadMax, (n * 1000) / lookRate);

  // lookSoon asks for the ticket in ms, if still needed then.
  function lookSoon(ms, needed) {
    if (lookTimer) return;
    lookTimer = setTimeout(async () => {
      if (state === "WAITING" && needed()) await fetchTicket();
      lookTimer = 0;
    }, ms);
  }

  // roomOff leaves a room the admin turned off: the buyer buys directly.
  function roomOff() {
    waitingRoom = false;
    if (state !== "WAITING" && state !== "COUNTDOWN") return; // SOLD_OUT stays, unwatched
    ticket = "";
    store(key("ticket"), "");
    position = 0;
    showPosition();
    setState(opensAt !== null && serverNow() < opensAt ? "COUNTDOWN" : "OPEN", "The waiting room was turned off: buy directly.");
  }

  // hear reads one answer of the public queue state: the close, the
  // sell-out, units coming back, a lost place, or the page's turn.
  async function hear(q) {
    const at = Date.parse(q.server_time || "");
    if (at < newest) return; // an older answer (another cache's) says nothing new
    if (!isNaN(at)) newest = at;
    showQueue(q);
    const lost = ticket && (q.admitted_through < through || (position > 0 && q.length < position));
    through = q.admitted_through;
    longest = Math.max(longest, q.length);
    if (q.closes_at && at >= Date.parse(q.closes_at)) {
      saleOver = true;
      if (state !== "SOLD_OUT") setState("CLOSED", "The sale has closed.");
      return;
    }
    if (!q.open) return;
    if (!ticket) {
      if (state === "COUNTDOWN" && q.sold_out) setState("SOLD_OUT", "Sold out.");
      else if (state === "SOLD_OUT" && !q.sold_out) setState("COUNTDOWN", "Units came back: join the queue.");
      return;
    }
    if (q.sold_out) {
      // No unit left and none can return: nobody can buy, admitted or not;
      // the ticket's look would say as much.
      if (state !== "SOLD_OUT") setState("SOLD_OUT", "Sold out.");
      return;
    }
    if (state === "SOLD_OUT") setState("WAITING", q.may_return ? "Sold out for now: units may still come back." : "Units came back.");
    if (lost) {
      // through only grows and places never leave the queue: the room lost
      // its queue. The ticket's look says whether to join again.
      const was = position;
      return lookSoon(spread(longest), () => position === was);
    }
    if (position > 0) {
      if (q.admitted_through >= position) await fetchTicket();
    } else if (q.admitted_through >= q.length) {
      await fetchTicket(); // everyone is admitted: no need to spread
    } else {
      lookSoon(spread(q.length), () => position === 0);
    }
  }

  // poll reads the public queue state about once a second, just after it
  // refreshes (nextPoll), while the page watches it.
  async function poll() {
    polling = true;
    while (watching()) {
      const r = await call("GET", "/skus/" + encodeURIComponent(sku) + "/queue", { auth: false, sync: false });
      let wait = 1000;
      if (r.status === 200) {
        wait = nextPoll(r.body);
        await hear(r.body);
      } else if (r.status === 404 && r.body.error === "no_waiting_room") {
        roomOff();
      }
      if (!watching()) break;
      await new Promise((res) => setTimeout(res, wait));
    }
    polling = false;
  }

  // buy reserves one unit with the admission token (on a SKU without a
  // waiting room, with an Idempotency-Key): a retry is a replay, never a
  // second unit.
  async function buy() {
    $("buy").disabled = true;
    const was = state;
    setState("BUYING");
    const headers = {};
    if (admission) headers["Admission-Token"] = admission.token;
    else {
      let k = sessionStorage.getItem(key("idem"));
      if (!k) { k = b64url(crypto.getRandomValues(new Uint8Array(16))); store(key("idem"), k); }
      headers["Idempotency-Key"] = k;
    }
    const r = await call("POST", "/reservations", { headers, body: { sku, qty: 1 } });
    if (r.status === 200 || r.status === 202 || r.status === 201) return follow(r.body);
    const e = r.body.error;
    if (e === "sold_out") return setState("SOLD_OUT", "Sold out.");
    if (e === "admission_expired") return setState("EXPIRED", "Your turn passed unused.");
    if (e === "sale_closed") return setState("CLOSED", "The sale has closed.");
    if (e === "admission_required") {
      // The admin turned a waiting room on: queue like everyone.
      waitingRoom = true;
      admission = null;
      return setState("COUNTDOWN", "This sale now has a waiting room: join the queue.");
    }
    if (r.status === 401) return;
    setState(was, r.status === 429 || r.status === 503 || r.status === 0
      ? "Busy; press Buy again (it cannot buy twice)." : "Could not buy: " + (r.body.message || e || r.status));
  }

  // follow polls a reservation until it is decided.
  async function follow(res) {
    store(key("reservation"), res.reservation_id);
    const el = $("reservation");
    el.hidden = false;
    el.dataset.reservationId = res.reservation_id;
    for (;;) {
      el.dataset.status = res.status;
      el.textContent = "Reservation " + res.reservation_id + ": " + res.status;
      if (res.status === "CONFIRMED") {
        return setState("CONFIRMED", res.pay_by ? "Reserved: pay by " + new Date(res.pay_by).toLocaleString() + "." : "Yours.");
      }
      if (res.status === "PAID") return setState("PAID", "Paid. Yours.");
      if (res.status === "CANCELLED") return setState("CANCELLED", "Cancelled" + (res.reason ? ": " + res.reason : "") + ".");
      if (state !== "HELD") setState("HELD", "Held for you; confirming…");
      await new Promise((r) => setTimeout(r, 500));
      const r = await call("GET", "/reservations/" + encodeURIComponent(res.reservation_id));
      if (r.status === 401) return;
      if (r.status === 200) res = r.body;
    }
  }

  // --- start ---------------------------------------------------------------

  async function main() {
    $("signin-form").addEventListener("submit", signIn);
    $("join").addEventListener("click", join);
    $("buy").addEventListener("click", buy);
    setInterval(tick, 250);
    try {
      const r = await fetch("config.json", { cache: "no-cache" });
      config = r.ok ? await r.json() : {};
    } catch (e) { config = {}; }
    if (config.sign_in === "oidc") {
      $("user").hidden = true;
      $("user").required = false;
      document.querySelector("label[for=user]").hidden = true;
      const q = new URLSearchParams(location.search);
      if (q.get("code")) {
        // Back from the identity provider: the SKU is in what authorize kept.
        sku = (JSON.parse(sessionStorage.getItem("holdfast.oidc") || "{}").sku) || "";
        $("sku").textContent = sku;
        const problem = await redeem(q);
        if (problem) showSignIn("Sign-in failed: " + problem);
        return;
      }
    }
    $("sku").textContent = sku;
    if (!sku) return setState("ERROR", "No product: open this page as /shop/?sku=<sku>.");
    const saved = sessionStorage.getItem("holdfast.token");
    if (saved && (claims(saved).exp || 0) * 1000 > Date.now()) return signedIn(saved);
    if (config.sign_in !== "dev" && config.sign_in !== "oidc") {
      return showSignIn("No sign-in is configured for this page (config.json).");
    }
    showSignIn();
  }

  main();
})();
