// Countersign review page: sign in with a bearer token, read what waits for a decision in your
// organisation, and approve, edit (lower only) or reject it through the HTTP API; below, what
// was decided lately, by whom, and how each call ended.
//
// No framework and no build. The DOM is built with textContent only, so nothing the API returns
// is ever parsed as HTML, and the Content-Security-Policy allows no inline code.

const TOKEN_KEY = "countersign.token";
/** The largest request body the API reads (16 KiB), less room for a decision's own fields. */
const MAX_SNAPSHOT = 16 * 1024 - 4096;
const DEV_SECRET_KEY = "countersign.devSecret";

const STATUS_LABELS = {
  awaiting_approval: "Waiting",
  approved: "Approved",
  rejected: "Rejected",
  expired: "Expired",
  superseded: "Superseded by an edit",
  cancelled: "Cancelled",
  answered: "Answered",
};

// What each conflict (409) means for the reviewer, by the API's stable error code.
const CONFLICTS = {
  already_decided: "Someone else already decided this approval.",
  stale_version: "The version you saw is no longer the one waiting.",
  superseded: "This version was replaced by an edit; decide the new version instead.",
  expired: "The deadline passed, so the approval has expired.",
  cancelled: "The run was cancelled.",
  already_approved_by_you: "You already approved this version; another person must approve it.",
  decision_id_reused: "This decision id was already used for a different decision.",
  run_finished: "The run has already finished.",
  contended: "Too many people decided at once; try again.",
};

const HEADINGS = {
  0: "Not sent",
  400: "Not accepted",
  401: "Not signed in",
  403: "Refused",
  404: "Not found",
  409: "Conflict",
  422: "Refused by policy",
  503: "Unavailable",
};

const state = {
  token: null,
  /** Approval id → { view, notice, pinned, element, key }. */
  items: new Map(),
  /** Approval ids in the order they are shown. */
  order: [],
  /** The server's clock minus this browser's, so the countdown follows the server. */
  skewMs: 0,
  /** Approvals with a decision in flight: a second click does nothing. */
  busy: new Set(),
  /** A submission's decision_id, kept until the server answers it, so a retry is the same decision. */
  submissions: new Map(),
  /** The approval a notice's link opened the page on (`#approval=ID`): selected once shown. */
  linked: null,
  /** Whether the linked approval was already scrolled to and focused. */
  linkedShown: false,
  /** How many pages of the queue are shown: "Show more" adds one, and a reload reads as many. */
  pages: 1,
  /** Where the page after the last one shown starts; null when nothing more waits. */
  next: null,
};

const $ = (id) => document.getElementById(id);

/** Builds an element: attributes by name (`text` sets its text), then children. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) continue;
    if (name === "text") node.textContent = String(value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// ---------------------------------------------------------------- the API

/** One API call. Resolves to `{ok, status, data}` or `{ok: false, status, code, message}`. */
async function api(method, path, body, extraHeaders = {}) {
  const headers = { Accept: "application/json", ...extraHeaders };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    return {
      ok: false,
      status: 0,
      code: "network",
      message: "the server did not answer; check the connection and try again",
    };
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (response.ok) return { ok: true, status: response.status, data };
  const error = data && data.error ? data.error : {};
  return {
    ok: false,
    status: response.status,
    code: error.code || `http_${response.status}`,
    message: error.message || response.statusText || "unexpected answer",
  };
}

/** A failure as one sentence that names its code. */
function describe(reply) {
  const heading = HEADINGS[reply.status] || `Error ${reply.status}`;
  const meaning = reply.status === 409 && CONFLICTS[reply.code] ? `${CONFLICTS[reply.code]} ` : "";
  return `${heading} (${reply.code}): ${meaning}${reply.message.replace(/\.$/, "")}.`;
}

function newDecisionId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// ---------------------------------------------------------------- money and values

const isMoney = (name, value) => /_cents$/.test(name) && Number.isInteger(value);

function dollars(cents) {
  const sign = cents < 0 ? "-" : "";
  const abs = Math.abs(cents);
  const whole = Math.floor(abs / 100).toLocaleString("en-US");
  return `${sign}$${whole}.${String(abs % 100).padStart(2, "0")}`;
}

/** Dollars as typed ("200", "199.5", "$199.50") in integer cents, or null. */
function parseDollars(text) {
  const match = /^\$?(\d{1,12})(?:\.(\d{1,2}))?$/.exec(text.trim());
  if (!match) return null;
  return Number(match[1]) * 100 + Number((match[2] || "").padEnd(2, "0"));
}

/** An argument's value: money in dollars and raw cents, text as is, the rest as JSON. */
function valueNode(name, value) {
  if (isMoney(name, value)) {
    return el("span", { class: "money" }, dollars(value), " ", el("span", { class: "raw", text: `(${value} cents)` }));
  }
  return el("span", { text: typeof value === "string" ? value : JSON.stringify(value) });
}

function argsText(args) {
  return Object.entries(args || {})
    .map(([name, value]) =>
      isMoney(name, value)
        ? `${name} = ${dollars(value)} (${value} cents)`
        : `${name} = ${typeof value === "string" ? value : JSON.stringify(value)}`,
    )
    .join(", ");
}

function actorText(actor) {
  if (!actor || typeof actor !== "object") return String(actor);
  switch (actor.kind) {
    case "person":
      return actor.id;
    case "agent":
      return "the agent";
    case "policy":
      return `policy version ${actor.version}`;
    case "system":
      return actor.component;
    default:
      return JSON.stringify(actor);
  }
}

function timeNode(iso) {
  return el("time", { datetime: iso, text: new Date(iso).toLocaleString() });
}

function leftText(ms) {
  let seconds = Math.floor(ms / 1000);
  const days = Math.floor(seconds / 86400);
  seconds -= days * 86400;
  const hours = Math.floor(seconds / 3600);
  seconds -= hours * 3600;
  const minutes = Math.floor(seconds / 60);
  seconds -= minutes * 60;
  const parts = [];
  if (days) parts.push(`${days}d`);
  if (days || hours) parts.push(`${hours}h`);
  parts.push(`${minutes}m`, `${String(seconds).padStart(2, "0")}s`);
  return `${parts.join(" ")} left`;
}

/** Updates every live countdown; past the deadline it reads EXPIRED. */
function tick() {
  const now = Date.now() + state.skewMs;
  for (const node of document.querySelectorAll(".countdown[data-expires]")) {
    const left = Date.parse(node.dataset.expires) - now;
    const expired = left <= 0;
    node.textContent = expired ? "EXPIRED" : leftText(left);
    node.classList.toggle("expired", expired);
  }
}

// ---------------------------------------------------------------- signing in

/** What the token says about its holder, for display only; the server verifies it. */
function claimsOf(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const bytes = Uint8Array.from(atob(part.padEnd(Math.ceil(part.length / 4) * 4, "=")), (c) =>
      c.charCodeAt(0),
    );
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    return null;
  }
}

function signedInPerson() {
  const claims = state.token && claimsOf(state.token);
  return claims && typeof claims.sub === "string" ? claims.sub : null;
}

function showWhoami() {
  const claims = claimsOf(state.token) || {};
  const roles = Array.isArray(claims.roles) ? claims.roles.join(", ") : claims.roles;
  const parts = [claims.tenant, roles ? `roles: ${roles}` : null].filter(Boolean);
  $("whoami").textContent = claims.sub
    ? `Signed in as ${claims.sub}${parts.length ? ` (${parts.join("; ")})` : ""}`
    : "Signed in";
  $("whoami").hidden = false;
  $("sign-out").hidden = false;
}

async function signIn(token) {
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("sign-in").hidden = true;
  $("sign-in-error").hidden = true;
  $("queue").hidden = false;
  showWhoami();
  await loadQueue();
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  state.items = new Map();
  state.order = [];
  state.pages = 1;
  state.next = null;
  state.submissions.clear();
  $("approvals").replaceChildren();
  $("decided").replaceChildren();
  $("queue").hidden = true;
  $("audit").hidden = true;
  $("whoami").hidden = true;
  $("sign-out").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = message || "";
  $("sign-in-error").hidden = !message;
  offerDevSignIn();
}

/**
 * The development picker appears only where the local server offers development sign-in: it
 * lists its people to whoever shows the sign-in secret, and refuses anyone else for want of it.
 */
async function offerDevSignIn() {
  const secret = sessionStorage.getItem(DEV_SECRET_KEY) || "";
  $("dev-secret").value = secret;
  const reply = await listDevPeople(secret);
  $("dev-sign-in").hidden = !(reply.ok || reply.code === "dev_secret");
}

/** Fills the picker with the people the secret lists; the latest request's answer wins. */
let devPeopleAsked = 0;
async function listDevPeople(secret) {
  const asked = ++devPeopleAsked;
  const headers = secret ? { "X-Countersign-Dev-Secret": secret } : {};
  const reply = await api("GET", "dev/people", undefined, headers);
  if (asked !== devPeopleAsked) return reply;
  const people = reply.ok && reply.data && Array.isArray(reply.data.people) ? reply.data.people : [];
  $("dev-person").replaceChildren(
    ...people.map((person) =>
      el("option", {
        value: person.name,
        text: `${person.name} (${person.tenant}; ${(person.roles || []).join(", ") || "no roles"})`,
      }),
    ),
  );
  return reply;
}

/**
 * Reads the fragment, which no request sends. The link `serve --dev-sign-in` prints carries the
 * sign-in secret: keep it in this tab and take it out of the address bar. A notice's link
 * (`#approval=ID`) names the approval to select once signed in; that part stays, so a reload
 * selects it again.
 */
function takeLinkFragment() {
  const fragment = new URLSearchParams(location.hash.replace(/^#/, ""));
  const secret = fragment.get("dev-secret");
  const approval = fragment.get("approval");
  if (approval && /^ap-[A-Za-z0-9_-]{1,61}$/.test(approval)) {
    state.linked = approval;
    state.linkedShown = false;
  }
  if (!secret) return;
  sessionStorage.setItem(DEV_SECRET_KEY, secret);
  const kept = state.linked ? `#approval=${state.linked}` : "";
  history.replaceState(null, "", location.pathname + location.search + kept);
}

/** The linked approval, read on its own when it no longer waits (decided, expired, cancelled). */
async function addLinked(items, order) {
  const id = state.linked;
  if (!id || items.has(id)) return;
  const reply = await api("GET", `approvals/${encodeURIComponent(id)}`);
  if (!reply.ok) {
    announce(`The linked approval ${id} cannot be shown: ${describe(reply)}`);
    state.linked = null;
    return;
  }
  const old = state.items.get(id);
  items.set(id, {
    view: reply.data,
    notice: old && old.notice ? old.notice : "You opened this approval from a link; it no longer waits for a decision.",
    pinned: true,
  });
  order.unshift(id);
}

/** Scrolls to the linked approval's card and focuses it, once per link. */
function showLinked() {
  if (!state.linked || state.linkedShown) return;
  const item = state.items.get(state.linked);
  if (!item || !item.element) return;
  state.linkedShown = true;
  const article = item.element.querySelector("article");
  article.scrollIntoView({ block: "start" });
  article.focus();
}

async function onDevSignIn(event) {
  event.preventDefault();
  const button = event.target.querySelector("button");
  button.disabled = true;
  const secret = $("dev-secret").value.trim();
  const reply = await api("POST", "dev/token", { as: $("dev-person").value }, {
    "X-Countersign-Dev-Secret": secret,
  });
  if (reply.ok) sessionStorage.setItem(DEV_SECRET_KEY, secret);
  button.disabled = false;
  if (!reply.ok) {
    $("sign-in-error").textContent = describe(reply);
    $("sign-in-error").hidden = false;
    return;
  }
  await signIn(reply.data.token);
}

async function onTokenSignIn(event) {
  event.preventDefault();
  const token = $("token").value.trim().replace(/^Bearer\s+/i, "");
  if (!token) {
    $("sign-in-error").textContent = "Paste a bearer token first.";
    $("sign-in-error").hidden = false;
    $("token").focus();
    return;
  }
  $("token").value = "";
  await signIn(token);
}

// ---------------------------------------------------------------- the queue

/** Whether a list was read; if not, its error line says why (a 401 signs out). */
function listed(reply, errorId) {
  $(errorId).hidden = reply.ok;
  if (reply.ok) return true;
  if (reply.status === 401) signOut(describe(reply));
  else $(errorId).textContent = describe(reply);
  return false;
}

/** One page of the queue: the first, or the one `cursor` starts. */
function queuePage(cursor) {
  return api("GET", cursor ? `approvals?cursor=${encodeURIComponent(cursor)}` : "approvals");
}

async function loadQueue() {
  // As many pages as are shown, so a reload keeps what "Show more" added.
  const views = [];
  let reply;
  let cursor = null;
  for (let page = 0; page < state.pages; page++) {
    reply = await queuePage(cursor);
    if (!listed(reply, "queue-error")) return;
    views.push(...reply.data.approvals);
    cursor = reply.data.next_cursor;
    if (!cursor) break;
  }
  state.next = cursor;
  state.skewMs = Date.parse(reply.data.now) - Date.now();
  const items = new Map();
  const order = [];
  for (const view of views) {
    const old = state.items.get(view.id);
    items.set(view.id, { view, notice: old ? old.notice : null, pinned: old ? old.pinned : false });
    order.push(view.id);
  }
  // A card that says why a decision failed stays, in its place, until it is dismissed.
  state.order.forEach((id, index) => {
    const old = state.items.get(id);
    if (old && old.pinned && !items.has(id)) {
      items.set(id, old);
      order.splice(Math.min(index, order.length), 0, id);
    }
  });
  await addLinked(items, order);
  for (const [id, item] of items) {
    const old = state.items.get(id);
    if (old && old !== item) Object.assign(item, { element: old.element, key: old.key });
  }
  state.items = items;
  state.order = order;
  renderQueue();
  showLinked();
  await loadDecided();
}

/** The next page of the queue, below the ones shown. */
async function loadMore() {
  if (!state.next) return;
  const reply = await queuePage(state.next);
  if (!listed(reply, "queue-error")) return;
  state.pages += 1;
  state.next = reply.data.next_cursor;
  const added = reply.data.approvals.filter((view) => !state.items.has(view.id));
  for (const view of added) {
    state.items.set(view.id, { view, notice: null, pinned: false });
    state.order.push(view.id);
  }
  renderQueue();
  announce(`${added.length} more shown.`);
  // Focus goes to the first card added, where reading goes on (the button may be gone).
  const first = added.length ? state.items.get(added[0].id).element.querySelector("article") : null;
  if (first) {
    first.setAttribute("tabindex", "-1");
    first.focus();
  }
}

// ---------------------------------------------------------------- recently decided

/** How many decided approvals the page lists. */
const DECIDED_SHOWN = 20;

/** What was decided lately in the organisation, newest first. */
async function loadDecided() {
  const reply = await api("GET", `approvals/decided?limit=${DECIDED_SHOWN}`);
  if (!listed(reply, "decided-error")) return;
  const decided = reply.data.approvals;
  $("decided").replaceChildren(...decided.map(decidedCard));
  $("decided-empty").hidden = decided.length > 0;
}

/** The words for an approval nobody decided, by its status. */
const UNDECIDED = {
  expired: "Nobody decided before the deadline; the approval expired.",
  cancelled: "The run was cancelled before anyone decided.",
};

/** How the call ended, or where it stands: its version, status and what it came back with;
 * for a call its caller runs, whether the caller claimed it in time. */
function callText(call, awaitingCaller) {
  if (!call) return "Not recorded.";
  const claim = call.claimed && call.claimed.by_caller;
  const told = call.result && call.result.content ? call.result.content : "";
  const shortened = told.length > 300 ? `${told.slice(0, 300)}…` : told;
  const version = `Version ${call.version}`;
  switch (call.status) {
    case "succeeded":
      return `${version} succeeded: ${shortened}`;
    case "failed":
      return `${version} failed: ${shortened}`;
    case "unknown":
      return `${version}: the outcome is unknown; it is held for reconciliation.`;
    case "approved":
      if (awaitingCaller && awaitingCaller.stuck)
        return `${version} is approved for its caller to run, and nobody has claimed it within its lease (since ${awaitingCaller.since}): its caller may be stuck.`;
      if (awaitingCaller) return `${version} is approved and waits for its caller to claim and run it.`;
      return `${version} is approved and runs when its run resumes.`;
    case "executing":
      if (claim)
        return `${version} is claimed by ${claim.claimant}, running in its caller's process; its outcome is due by ${claim.lease_expires_at}.`;
      return `${version} is running.`;
    case "awaiting_approval":
      return `${version} waits for a decision.`;
    case "superseded":
      return `${version} was replaced by an edit.`;
    default:
      return `${version} did not run (${call.status.replace(/_/g, " ")}): ${shortened}`;
  }
}

/** One decided approval: what, for which task, who decided what, and how the call ended. */
function decidedCard(v) {
  const id = v.id;
  const facts = el("dl", { class: "facts" });
  const fact = (term, cls, ...value) => facts.append(el("dt", { text: term }), el("dd", { class: cls }, ...value));
  fact("Agent", "agent", v.agent || "");
  fact("Task", "task", v.task || "(its run could not be read)");
  const decisions = (v.decisions || []).map((d) => el("li", { text: decisionText(d) }));
  fact(
    "Decided",
    "decisions",
    decisions.length ? el("ul", {}, decisions) : UNDECIDED[v.status] || STATUS_LABELS[v.status] || v.status,
  );
  fact("The call", "call", callText(v.call, v.awaiting_caller));
  if (v.resolved_at) fact("Resolved", "resolved", timeNode(v.resolved_at));
  const article = el(
    "article",
    {
      class: "approval resolved",
      "data-decided-id": id,
      "data-status": v.status,
      "aria-labelledby": `decided-title-${id}`,
    },
    el(
      "h3",
      { id: `decided-title-${id}` },
      el("code", { text: v.tool }),
      `, version ${v.action_version}`,
      el("span", { class: "badge status", text: STATUS_LABELS[v.status] || v.status }),
    ),
    facts,
    el(
      "p",
      { class: "ids" },
      "approval ",
      el("code", { text: id }),
      " · run ",
      el("code", { text: v.run_id }),
    ),
    el("div", { class: "actions" }, auditButton(v.run_id)),
  );
  return el("li", {}, article);
}

function onDecidedClick(event) {
  const button = event.target.closest("button.audit-link");
  if (button) showAudit(button.dataset.runId, button);
}

/** Reads one approval again, after the server said it moved on. */
async function refreshItem(id) {
  const reply = await api("GET", `approvals/${encodeURIComponent(id)}`);
  const item = state.items.get(id);
  if (reply.ok && item) item.view = reply.data;
}

function renderQueue() {
  const list = $("approvals");
  const wanted = state.order.map((id) => cardFor(state.items.get(id)));
  // Move only what changed, so focus and half-typed input elsewhere stay put.
  wanted.forEach((node, index) => {
    if (list.children[index] !== node) list.insertBefore(node, list.children[index] || null);
  });
  while (list.children.length > wanted.length) list.lastElementChild.remove();
  $("queue-empty").hidden = state.order.length > 0;
  $("more").hidden = !state.next;
  tick();
}

function cardFor(item) {
  const key = JSON.stringify([item.view, item.notice, item.pinned, item.view.id === state.linked]);
  if (item.element && item.key === key) return item.element;
  item.key = key;
  item.element = buildCard(item);
  return item.element;
}

function buildCard(item) {
  const v = item.view;
  const id = v.id;
  const awaiting = v.status === "awaiting_approval";
  const claim = v.args && typeof v.args.claim_id === "string" ? ` for claim ${v.args.claim_id}` : "";
  const approvedBy = Array.isArray(v.approved_by)
    ? v.approved_by
    : [...new Set((v.decisions || []).filter((d) => d.choice !== "reject").map((d) => d.by))];
  const me = signedInPerson();

  const linked = id === state.linked;
  const article = el(
    "article",
    {
      class: `approval${awaiting ? "" : " resolved"}${linked ? " linked" : ""}`,
      "data-approval-id": id,
      "data-status": v.status,
      "aria-labelledby": `title-${id}`,
      ...(linked ? { "aria-current": "true", tabindex: "-1" } : {}),
    },
    el(
      "h3",
      { id: `title-${id}` },
      el("code", { text: v.tool }),
      `${claim}, version ${v.action_version}`,
      el("span", { class: "badge status", text: STATUS_LABELS[v.status] || v.status }),
    ),
  );

  if (linked) {
    article.append(el("p", { class: "linked-note", text: "The approval your link opened." }));
  }
  if (item.notice) {
    article.append(el("p", { class: "notice", role: "alert", tabindex: "-1", text: item.notice }));
  }
  if (awaiting && me && (v.requested_by || []).includes(me)) {
    article.append(
      el("p", { class: "help", text: `You asked for this, so the server refuses your decision on it.` }),
    );
  }

  const facts = el("dl", { class: "facts" });
  const fact = (term, cls, ...value) => facts.append(el("dt", { text: term }), el("dd", { class: cls }, ...value));
  fact("Agent", "agent", v.agent || "");
  fact("Task", "task", v.task || "(its run could not be read)");
  // An edited version's words are its editor's, not the agent's.
  const saying = v.previous ? `${v.previous.edited_by} says` : "The agent says";
  fact(saying, "explanation", el("blockquote", { text: v.explanation }));
  fact("Why a person decides", "reason", `${v.reason} (policy version ${v.policy_version})`);
  if ((v.rules || []).length) fact("Rules that asked", "rules", v.rules.join(", "));
  const excluded = (v.requested_by || []).join(" and ");
  const escalated = (v.escalated_to || []).length ? ` (escalated: or the ${v.escalated_to.join(" or ")} role)` : "";
  // Rules of several roles matched: each role must approve, with its own quorum.
  const also = (v.also || []).map((need) => ` and ${need.quorum} with the ${need.role} role`).join("");
  fact(
    "Who may approve",
    "who",
    `Anyone with the ${v.approver_role} role${escalated}${also}`,
    excluded ? `, except ${excluded}, who asked for this` : "",
  );
  const quorum = v.quorum + (v.also || []).reduce((sum, need) => sum + need.quorum, 0);
  fact(
    "Approvals",
    "quorum",
    `${v.still_needed} of ${quorum} still needed; approved so far: ${approvedBy.length ? approvedBy.join(", ") : "nobody yet"}`,
  );
  if (awaiting) {
    fact(
      "Deadline",
      "deadline",
      timeNode(v.expires_at),
      " — ",
      el("span", { class: "countdown", "data-expires": v.expires_at }),
    );
  } else if (v.resolved_at) {
    fact("Resolved", "resolved", timeNode(v.resolved_at));
  }
  if ((v.decisions || []).length) {
    fact(
      "Decisions",
      "decisions",
      el(
        "ul",
        {},
        v.decisions.map((d) => el("li", { text: decisionText(d) })),
      ),
    );
  }
  if ((v.comments || []).length) {
    fact(
      "Comments",
      "comments",
      el(
        "ul",
        {},
        v.comments.map((c) =>
          el("li", {}, el("strong", { text: c.by }), ` (${new Date(c.at).toLocaleString()}): `, el("span", { class: "comment-text", text: c.text })),
        ),
      ),
    );
  }
  article.append(facts);

  article.append(
    el("h4", {}, "The exact call: ", el("code", { text: v.tool })),
    argsTable(v.args, `Every argument of version ${v.action_version}, exactly as it runs`),
  );
  if (v.previous) article.append(...changes(v));
  article.append(
    el(
      "p",
      { class: "ids" },
      "Arguments hash ",
      el("code", { class: "hash", text: v.args_hash }),
      " · approval ",
      el("code", { text: id }),
      " · run ",
      el("code", { text: v.run_id }),
    ),
  );

  const actions = el("div", { class: "actions" });
  if (awaiting && v.kind === "recovery") {
    // Its outcome is unknown and its tool cannot be asked: the recovery owner says what happened.
    actions.append(el("button", { type: "button", class: "took-effect", text: "It took effect" }));
    actions.append(el("button", { type: "button", class: "did-not-take-effect", text: "It did not take effect" }));
  } else if (awaiting) {
    actions.append(el("button", { type: "button", class: "approve", text: `Approve version ${v.action_version}` }));
    if (v.editable_amount) actions.append(editForm(v));
    actions.append(rejectForm(v));
  }
  actions.append(commentForm(v));
  actions.append(auditButton(v.run_id));
  if (item.pinned && !awaiting) {
    actions.append(el("button", { type: "button", class: "dismiss", text: "Dismiss" }));
  }
  article.append(actions);
  return el("li", {}, article);
}

/** The button that opens a run's audit trail. */
function auditButton(runId) {
  return el("button", {
    type: "button",
    class: "audit-link",
    "data-run-id": runId,
    "aria-label": `Audit trail of run ${runId}`,
    text: "Audit trail",
  });
}

function decisionText(d) {
  const when = new Date(d.at).toLocaleString();
  switch (d.choice) {
    case "approve":
      return `${d.by} approved version ${d.action_version} (${when})`;
    case "edit":
      return `${d.by} lowered the amount to ${dollars(d.amount)} (${d.amount} cents)${d.note ? `: “${d.note}”` : ""} (${when})`;
    case "reject":
      return `${d.by} rejected version ${d.action_version}: “${d.reason}” (${when})`;
    case "took_effect":
      return `${d.by} said version ${d.action_version} took effect${d.note ? `: “${d.note}”` : ""} (${when})`;
    case "did_not_take_effect":
      return `${d.by} said version ${d.action_version} did not take effect${d.note ? `: “${d.note}”` : ""} (${when})`;
    default:
      return `${d.by}: ${d.choice} (${when})`;
  }
}

function argsTable(args, caption) {
  return el(
    "table",
    { class: "args" },
    el("caption", { text: caption }),
    el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Argument" }), el("th", { scope: "col", text: "Value" }))),
    el(
      "tbody",
      {},
      Object.entries(args || {}).map(([name, value]) =>
        el(
          "tr",
          { "data-arg": name },
          el("th", { scope: "row" }, el("code", { text: name })),
          el("td", {}, valueNode(name, value)),
        ),
      ),
    ),
  );
}

/** What an edit changed: each argument whose value differs, old and new. */
function changes(v) {
  const before = v.previous.args || {};
  const after = v.args || {};
  const names = [...new Set([...Object.keys(before), ...Object.keys(after)])].filter(
    (name) => JSON.stringify(before[name]) !== JSON.stringify(after[name]),
  );
  const shown = (name, value) => (value === undefined ? el("span", { text: "(none)" }) : valueNode(name, value));
  return [
    el("h4", { text: "What the edit changed" }),
    el(
      "p",
      { class: "edited" },
      `${v.previous.edited_by} edited version ${v.previous.version} into version ${v.action_version}`,
      v.previous.note ? `: “${v.previous.note}”` : ".",
    ),
    el(
      "table",
      { class: "changes" },
      el("caption", { text: `Changed from version ${v.previous.version}` }),
      el(
        "thead",
        {},
        el(
          "tr",
          {},
          el("th", { scope: "col", text: "Argument" }),
          el("th", { scope: "col", text: `Before (version ${v.previous.version})` }),
          el("th", { scope: "col", text: `Now (version ${v.action_version})` }),
        ),
      ),
      el(
        "tbody",
        {},
        names.map((name) =>
          el(
            "tr",
            { "data-arg": name },
            el("th", { scope: "row" }, el("code", { text: name })),
            el("td", { class: "before" }, shown(name, before[name])),
            el("td", { class: "after" }, shown(name, after[name])),
          ),
        ),
      ),
    ),
  ];
}

function editForm(v) {
  const id = v.id;
  const now = dollars(v.editable_amount.cents);
  return el(
    "details",
    { class: "edit" },
    el("summary", { text: "Edit: approve a lower amount" }),
    el(
      "form",
      { class: "edit-form", novalidate: true },
      el("label", { for: `amount-${id}`, text: `New amount in dollars, below ${now}` }),
      el("input", {
        id: `amount-${id}`,
        name: "amount",
        type: "text",
        inputmode: "decimal",
        autocomplete: "off",
        required: true,
        "aria-describedby": `amount-error-${id}`,
      }),
      el("p", { id: `amount-error-${id}`, class: "field-error", hidden: true }),
      el("label", { for: `note-${id}`, text: "Note for the record (optional)" }),
      el("input", { id: `note-${id}`, name: "note", type: "text", maxlength: "2000", autocomplete: "off" }),
      el("button", { type: "submit", class: "edit-submit", text: "Approve the lower amount" }),
    ),
  );
}

function rejectForm(v) {
  return textForm(v, {
    kind: "reject",
    summary: "Reject",
    field: "reason",
    name: "reason",
    label: "Reason (required; the agent is told)",
    button: `Reject version ${v.action_version}`,
  });
}

/** A comment decides nothing: a question to the requester, say. Open on any approval. */
function commentForm(v) {
  return textForm(v, {
    kind: "comment",
    summary: "Comment",
    field: "comment",
    name: "text",
    label: "Comment (decides nothing; the organisation can read it)",
    button: "Add comment",
  });
}

/** A folded form of one required text: `kind` names its classes, `field` its element ids. */
function textForm(v, { kind, summary, field, name, label, button }) {
  const id = v.id;
  return el(
    "details",
    { class: kind },
    el("summary", { text: summary }),
    el(
      "form",
      { class: `${kind}-form`, novalidate: true },
      el("label", { for: `${field}-${id}`, text: label }),
      el("textarea", {
        id: `${field}-${id}`,
        name,
        rows: "2",
        maxlength: "2000",
        required: true,
        "aria-describedby": `${field}-error-${id}`,
      }),
      el("p", { id: `${field}-error-${id}`, class: "field-error", hidden: true }),
      el("button", { type: "submit", class: `${kind}-submit`, text: button }),
    ),
  );
}

async function addComment(id, input) {
  const item = state.items.get(id);
  if (!item || state.busy.has(id)) return;
  setBusy(id, true);
  const reply = await api("POST", `approvals/${encodeURIComponent(id)}/comments`, { text: input.value.trim() });
  setBusy(id, false);
  if (reply.status === 401) return signOut(describe(reply));
  if (!reply.ok) {
    fieldError(input, describe(reply));
    return;
  }
  item.view = reply.data;
  renderQueue();
  announce(`Your comment on ${reply.data.tool} version ${reply.data.action_version} is added.`);
}

function fieldError(input, message) {
  const error = $(input.getAttribute("aria-describedby"));
  error.textContent = message || "";
  error.hidden = !message;
  if (message) {
    input.setAttribute("aria-invalid", "true");
    input.focus();
  } else {
    input.removeAttribute("aria-invalid");
  }
  return !message;
}

// ---------------------------------------------------------------- deciding

function setBusy(id, busy) {
  const item = state.items.get(id);
  if (busy) state.busy.add(id);
  else state.busy.delete(id);
  if (!item || !item.element) return;
  item.element.querySelector("article").setAttribute("aria-busy", String(busy));
  for (const control of item.element.querySelectorAll(".actions button, .actions input, .actions textarea")) {
    if (!control.classList.contains("audit-link")) control.disabled = busy;
  }
}

function announce(text) {
  $("queue-status").textContent = text;
}

async function decide(id, choice, extra = {}) {
  const item = state.items.get(id);
  if (!item || state.busy.has(id)) return;
  const body = { action_version: item.view.action_version, choice, ...extra };
  // The same submission again (after a lost answer) reuses its decision_id: the server then
  // returns the recorded outcome instead of deciding twice.
  const key = `${id} ${JSON.stringify(body)}`;
  const decisionId = state.submissions.get(key) || newDecisionId();
  state.submissions.set(key, decisionId);
  setBusy(id, true);
  // The approval as this page shows it (as read, or as this page's comment left it): while it
  // is unchanged, the server decides without reading it again. One too large for a request
  // body (many long comments) is left out: the server then reads the approval first.
  const snapshot = item.view.snapshot;
  const shown = snapshot && snapshot.length <= MAX_SNAPSHOT ? { snapshot } : {};
  const reply = await api("POST", `approvals/${encodeURIComponent(id)}/decisions`, {
    decision_id: decisionId,
    ...body,
    ...shown,
  });
  const answered = reply.status !== 0 && reply.status < 500;
  if (answered) state.submissions.delete(key);
  setBusy(id, false);

  if (reply.ok) {
    item.notice = null;
    item.pinned = false;
    announce(outcomeText(reply.data));
    await loadQueue();
    $("queue-heading").focus();
    return;
  }
  if (reply.status === 401) {
    signOut(describe(reply));
    return;
  }
  item.notice = answered
    ? describe(reply)
    : `${describe(reply)} Trying again sends the same decision, so it cannot be decided twice.`;
  item.pinned = true;
  if (reply.status === 409 || reply.status === 404) {
    await refreshItem(id);
    await loadQueue();
  } else {
    renderQueue();
  }
  const notice = item.element && item.element.querySelector(".notice");
  if (notice) notice.focus();
}

function outcomeText(report) {
  const d = report.decision;
  const what = `${report.approval.tool} version ${d.action_version}`;
  let text;
  switch (d.effect.effect) {
    case "approved":
      text = `You approved ${what}.`;
      break;
    case "counted":
      text = `Your approval of ${what} is recorded; ${d.effect.still_needed} more needed.`;
      break;
    case "rejected":
      text = `You rejected ${what}: “${d.reason}”. The agent is told not to retry.`;
      break;
    case "edited": {
      const next = report.next_approval;
      const lowered = `You lowered ${what} to ${dollars(d.amount)} (${d.amount} cents)`;
      if (next && next.status === "awaiting_approval") {
        const approvers = new Set(
          (next.decisions || [])
            .filter((x) => x.choice !== "reject" && x.action_version === next.action_version)
            .map((x) => x.by),
        );
        const needed = Math.max(next.quorum - approvers.size, 0);
        text = `${lowered}: version ${d.effect.new_version} waits for ${needed} more approval${needed === 1 ? "" : "s"}.`;
      } else {
        const status = next ? STATUS_LABELS[next.status] || next.status : "Approved";
        text = `${lowered}: version ${d.effect.new_version} is ${status.toLowerCase()}.`;
      }
      break;
    }
    case "answered":
      text = d.effect.took_effect
        ? `You said ${what} took effect; the run goes on with that.`
        : `You said ${what} did not take effect; the agent is told.`;
      break;
    default:
      text = `Decision recorded on ${what}.`;
  }
  if (report.replayed) text = `Already recorded: ${text}`;
  if (report.run) {
    text += ` The run is ${report.run.status.replace(/_/g, " ")}`;
    text += report.run.answer ? `: ${report.run.answer}` : ".";
  }
  return text;
}

function onQueueClick(event) {
  const button = event.target.closest("button");
  if (!button) return;
  const card = button.closest("[data-approval-id]");
  const id = card && card.dataset.approvalId;
  if (button.classList.contains("approve")) {
    decide(id, "approve");
  } else if (button.classList.contains("took-effect")) {
    decide(id, "took_effect");
  } else if (button.classList.contains("did-not-take-effect")) {
    decide(id, "did_not_take_effect");
  } else if (button.classList.contains("audit-link")) {
    showAudit(button.dataset.runId, button);
  } else if (button.classList.contains("dismiss")) {
    const item = state.items.get(id);
    if (item) Object.assign(item, { pinned: false, notice: null });
    state.order = state.order.filter((x) => x !== id);
    state.items.delete(id);
    renderQueue();
    $("queue-heading").focus();
  }
}

function onQueueSubmit(event) {
  event.preventDefault();
  const form = event.target;
  const card = form.closest("[data-approval-id]");
  const item = card && state.items.get(card.dataset.approvalId);
  if (!item) return;
  if (form.classList.contains("edit-form")) {
    const input = form.elements.amount;
    const cents = parseDollars(input.value);
    const limit = item.view.editable_amount.cents;
    let problem = null;
    if (cents === null) problem = "Write the amount in dollars, such as 200 or 199.50.";
    else if (cents === 0) problem = "An edit cannot lower the amount to zero; reject the call instead.";
    else if (cents >= limit) problem = `An edit may only lower the amount: enter less than ${dollars(limit)}.`;
    if (!fieldError(input, problem)) return;
    const note = form.elements.note.value.trim();
    decide(item.view.id, "edit", { amount: input.value.trim(), ...(note ? { note } : {}) });
  } else if (form.classList.contains("comment-form")) {
    const input = form.elements.text;
    if (!fieldError(input, input.value.trim() ? null : "Write the comment first.")) return;
    addComment(item.view.id, input);
  } else if (form.classList.contains("reject-form")) {
    const input = form.elements.reason;
    const reason = input.value.trim();
    if (!fieldError(input, reason ? null : "Say why: the agent is told the reason.")) return;
    decide(item.view.id, "reject", { reason });
  }
}

// ---------------------------------------------------------------- the audit trail

async function showAudit(runId, opener) {
  const reply = await api("GET", `runs/${encodeURIComponent(runId)}/audit`);
  if (!reply.ok && reply.status === 401) return signOut(describe(reply));
  state.auditOpener = opener;
  $("queue").hidden = true;
  $("audit").hidden = false;
  $("audit-heading").textContent = `Audit trail of run ${runId}`;
  $("audit-error").hidden = reply.ok;
  $("audit-error").textContent = reply.ok ? "" : describe(reply);
  $("audit-body").replaceChildren(...(reply.ok ? renderHistory(reply.data) : []));
  $("audit").focus();
}

function closeAudit() {
  $("audit").hidden = true;
  $("queue").hidden = false;
  const opener = state.auditOpener;
  if (opener && opener.isConnected) opener.focus();
  else $("queue-heading").focus();
}

function renderHistory(history) {
  const run = history.run;
  const summary = el("dl", { class: "facts run-summary" });
  const fact = (term, value) => {
    if (value !== null && value !== undefined && value !== "") {
      summary.append(el("dt", { text: term }), el("dd", {}, value));
    }
  };
  fact("Status", run.status.replace(/_/g, " "));
  fact("Task", run.task);
  fact("Requested by", run.requested_by);
  fact("Started by", run.started_by);
  fact("Policy version", String(run.policy_version));
  fact("Answer", run.answer);
  fact("Error", run.error);

  const actions = el(
    "ol",
    { class: "audit-entries actions-list" },
    (history.actions || []).map((a) =>
      el(
        "li",
        { "data-action": a.id, "data-version": a.version },
        el("strong", {}, el("code", { text: a.tool })),
        ` version ${a.version}: ${a.status.replace(/_/g, " ")}`,
        el(
          "dl",
          {},
          el("dt", { text: "action id" }),
          el("dd", {}, el("code", { text: a.id })),
          el("dt", { text: "args" }),
          el("dd", { text: argsText(a.args) }),
          el("dt", { text: "args hash" }),
          el("dd", {}, el("code", { text: a.args_hash })),
          (a.authorized_by || []).length
            ? [el("dt", { text: "authorized by" }), el("dd", { text: a.authorized_by.map(actorText).join(", ") })]
            : null,
          a.result ? [el("dt", { text: "result" }), el("dd", { text: a.result.content })] : null,
        ),
      ),
    ),
  );

  const entries = el(
    "ol",
    { class: "audit-entries" },
    (history.entries || []).map((entry) => {
      const details = el("dl");
      for (const [name, value] of Object.entries(entry)) {
        if (["at", "run_id", "actor", "event"].includes(name)) continue;
        details.append(el("dt", { text: name.replace(/_/g, " ") }), el("dd", {}, entryValue(name, value)));
      }
      return el(
        "li",
        { "data-event": entry.event },
        el("strong", { class: "event", text: entry.event }),
        ` by ${actorText(entry.actor)}, `,
        timeNode(entry.at),
        details,
      );
    }),
  );

  return [
    summary,
    el("h3", { text: "Actions, every version in the order proposed" }),
    actions,
    el("h3", { text: "Events, oldest first" }),
    entries,
  ];
}

function entryValue(name, value) {
  if (name === "args") return el("span", { text: argsText(value) });
  if (name === "args_hash") return el("code", { text: value });
  if (name === "amount" && Number.isInteger(value)) return valueNode("amount_cents", value);
  if (name === "authorized_by" && Array.isArray(value)) return el("span", { text: value.map(actorText).join(", ") });
  if (typeof value === "boolean") return el("span", { text: value ? "yes" : "no" });
  if (typeof value === "string") return el("span", { text: value });
  if (Array.isArray(value) && value.every((x) => typeof x === "string")) return el("span", { text: value.join(", ") });
  if (value && typeof value === "object") {
    return el(
      "span",
      {
        text: Object.entries(value)
          .map(([k, x]) => `${k.replace(/_/g, " ")}: ${typeof x === "string" ? x : JSON.stringify(x)}`)
          .join("; "),
      },
    );
  }
  return el("span", { text: JSON.stringify(value) });
}

// ---------------------------------------------------------------- start

function start() {
  takeLinkFragment();
  window.addEventListener("hashchange", () => {
    takeLinkFragment();
    if (state.token) loadQueue();
  });
  $("dev-sign-in").addEventListener("submit", onDevSignIn);
  $("dev-secret").addEventListener("input", () => listDevPeople($("dev-secret").value.trim()));
  $("token-sign-in").addEventListener("submit", onTokenSignIn);
  $("sign-out").addEventListener("click", () => signOut());
  $("refresh").addEventListener("click", () => loadQueue());
  $("more").addEventListener("click", () => loadMore());
  $("audit-close").addEventListener("click", closeAudit);
  $("approvals").addEventListener("click", onQueueClick);
  $("approvals").addEventListener("submit", onQueueSubmit);
  $("decided").addEventListener("click", onDecidedClick);
  $("queue-heading").setAttribute("tabindex", "-1");
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && state.token && state.busy.size === 0) loadQueue();
  });
  setInterval(tick, 1000);

  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved);
  else signOut();
}

start();
