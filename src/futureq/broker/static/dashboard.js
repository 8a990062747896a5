// The FutureQ dashboard: one WebSocket to this node's /ws, speaking the wire protocol
// (docs/protocol.md): HELLO, then WATCH; the node pushes a WATCH_UPDATE (its overview)
// every second. Nothing is polled. When the connection drops the page says so at once,
// greys out what it shows, and reconnects with backoff.
"use strict";

const FRAME = {
  HELLO: 1, HELLO_OK: 2, ERROR: 13, OK: 14, PING: 16, PONG: 17, WATCH: 35, WATCH_UPDATE: 36,
  BROWSE_COUNTS: 47, BROWSE_COUNTS_OK: 48,
};
const AUTH_FAILED = 107;
const WATCH_INTERVAL_MS = 1000;
const STALE_AFTER_MS = 3500;
const TOKEN_KEY = "futureq.dashboard.token";
const HISTORY_S = 300;
// Per group: due within the next minute / hour / day (overdue included), by BROWSE_COUNTS
// for the groups shown first, on the leader only, every COUNTS_EVERY_MS (the leader keeps
// a due-time histogram per group asked about: O(buckets) per request).
const COUNTS_BOUNDS_MS = [60000, 3600000, 86400000];
const COUNTS_FIELDS = ["due_1m", "due_1h", "due_1d"];
const COUNTS_EVERY_MS = 5000;
const COUNTS_GROUPS = 20;
const COUNTS_FIRST_ID = 1000;

const $ = (id) => document.getElementById(id);
const page = {
  ws: null,
  overview: null,
  lastUpdateAt: 0,
  retryMs: 500,
  retryTimer: null,
  lostSince: null,
  lostReason: "",
  authFailed: false,
  counts: new Map(),
  countsRequests: new Map(),
  countsAt: 0,
  nextRequestId: COUNTS_FIRST_ID,
};

const groupKey = (topic, group) => `${topic}\u0000${group}`;

// Ask the leader for the due counts of the groups shown first (at most every COUNTS_EVERY_MS).
// On a sharded node (o.shards) this WebSocket reaches shard 0 only: a group of another
// shard (g.shard) is asked through /api/browse/counts, which shard 0 routes to its shard
// (sent here, BROWSE_COUNTS was refused WRONG_SHARD and the row showed "–").
function requestCounts(ws, o) {
  const roles = new Map((o.shards || []).map((s) => [s.shard, s.error ? "" : s.role]));
  const roleOf = (g) => (g.shard ? roles.get(g.shard) : o.node.role);
  for (const g of o.groups) {
    if (roleOf(g) !== "leader") page.counts.delete(groupKey(g.topic, g.group));
  }
  if (Date.now() - page.countsAt < COUNTS_EVERY_MS) return;
  page.countsAt = Date.now();
  for (const g of o.groups.slice(0, COUNTS_GROUPS)) {
    if (roleOf(g) !== "leader") continue;
    const key = groupKey(g.topic, g.group);
    if (g.shard) {
      fetchCounts(g.topic, g.group, key);
      continue;
    }
    const id = page.nextRequestId++;
    page.countsRequests.set(id, key);
    ws.send(frameBytes([FRAME.BROWSE_COUNTS, id, g.topic, g.group, COUNTS_BOUNDS_MS, true]));
  }
}

async function fetchCounts(topic, group, key) {
  const query = new URLSearchParams({
    topic, group, bounds_ms: COUNTS_BOUNDS_MS.join(","), relative: "true",
  });
  const token = sessionStorage.getItem(TOKEN_KEY);
  try {
    const answer = await fetch(`/api/browse/counts?${query}`, {
      cache: "no-store",
      headers: token ? { Authorization: `Bearer ${token}` } : {},
    });
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    setCounts(key, (await answer.json()).counts);
  } catch (error) {
    page.counts.delete(key);  // not answering, not the leader, no permission: unknown
    if (page.overview) renderGroups(page.overview);
  }
}

// Cumulative: due within 1 min, 1 h, 1 d (a nil count: not known, "at least" before).
function setCounts(key, counts) {
  let sum = 0;
  page.counts.set(key, counts.map((c) => (c === null ? null : (sum += c))));
  if (page.overview) renderGroups(page.overview);
}

// ------------------------------------------------------------------ formatting

const integer = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"));

function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(unit === 0 || value >= 100 ? 0 : 1)} ${units[unit]}`;
}

function latenessLabel(ms) {
  if (ms === null) return "more";
  return ms < 1000 ? `≤${ms} ms` : `≤${ms / 1000} s`;
}

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";
function svgEl(tag, attributes = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// ------------------------------------------------------------------ the connection

function frameBytes(value) {
  const body = msgpack.encode(value);
  const out = new Uint8Array(4 + body.length);
  new DataView(out.buffer).setUint32(0, body.length);
  out.set(body, 4);
  return out;
}

function decodeFrame(buffer) {
  const bytes = new Uint8Array(buffer);
  const length = new DataView(buffer).getUint32(0);
  if (length !== bytes.length - 4) throw new Error("a message that is not one frame");
  return msgpack.decode(bytes.subarray(4));
}

function connect() {
  clearTimeout(page.retryTimer);
  page.countsRequests.clear();
  page.countsAt = 0;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const ws = new WebSocket(`${scheme}://${location.host}/ws`, ["futureq.v1"]);
  ws.binaryType = "arraybuffer";
  page.ws = ws;
  setConnection(page.overview ? "stale" : "connecting", "connecting…");
  ws.onopen = () => {
    const token = sessionStorage.getItem(TOKEN_KEY);
    ws.send(frameBytes([FRAME.HELLO, 1, [1], "dashboard", token]));
  };
  ws.onmessage = (event) => {
    let frame;
    try {
      frame = decodeFrame(event.data);
    } catch (error) {
      page.lostReason = `bad data from the node: ${error.message}`;
      ws.close();
      return;
    }
    onFrame(ws, frame);
  };
  ws.onclose = (event) => {
    if (page.ws !== ws) return;
    page.ws = null;
    if (page.lostSince === null) page.lostSince = Date.now();
    if (!page.lostReason) {
      page.lostReason = event.code === 1006 ? "the node cannot be reached" : `closed (code ${event.code})`;
    }
    if (page.authFailed) {
      setConnection("lost", "needs a token");
      return;
    }
    const wait = page.retryMs;
    page.retryMs = Math.min(page.retryMs * 2, 8000);
    page.retryTimer = setTimeout(connect, wait);
    showLost();
  };
}

function onFrame(ws, [type, requestId, ...fields]) {
  switch (type) {
    case FRAME.HELLO_OK:
      ws.send(frameBytes([FRAME.WATCH, 2, WATCH_INTERVAL_MS]));
      $("token-form").hidden = true;
      page.authFailed = false;
      break;
    case FRAME.WATCH_UPDATE:
      page.retryMs = 500;
      page.lostSince = null;
      page.lostReason = "";
      page.lastUpdateAt = Date.now();
      page.overview = fields[0];
      render(fields[0]);
      tick();
      requestCounts(ws, fields[0]);
      break;
    case FRAME.BROWSE_COUNTS_OK: {
      const key = page.countsRequests.get(requestId);
      page.countsRequests.delete(requestId);
      if (key === undefined) break;
      setCounts(key, fields[2]);
      break;
    }
    case FRAME.PING:
      ws.send(frameBytes([FRAME.PONG, requestId]));
      break;
    case FRAME.ERROR: {
      const [code, message] = fields;
      if (page.countsRequests.has(requestId)) {
        // A refused count (not the leader any more, no permission): not a lost connection.
        page.counts.delete(page.countsRequests.get(requestId));
        page.countsRequests.delete(requestId);
        break;
      }
      page.lostReason = message;
      if (code === AUTH_FAILED) {
        page.authFailed = true;
        const form = $("token-form");
        form.hidden = false;
        $("token-error").textContent = sessionStorage.getItem(TOKEN_KEY) ? message : "";
      }
      break;
    }
    default:
      break;
  }
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token-input").value);
  page.authFailed = false;
  page.retryMs = 500;
  if (page.ws) page.ws.close();
  connect();
});

function setConnection(state, text) {
  const box = $("connection");
  box.dataset.state = state;
  $("connection-text").textContent = text;
  document.body.classList.toggle("stale", state === "lost" || state === "stale");
}

function showLost() {
  const since = page.lostSince ? duration(Date.now() - page.lostSince) : "";
  setConnection("lost", `connection to the node lost ${since} ago: ${page.lostReason}; reconnecting…`);
}

// Once a second: how fresh is what we show?
function tick() {
  if (page.ws === null && page.lostSince !== null) {
    if (!page.authFailed) showLost();
    return;
  }
  if (!page.lastUpdateAt) return;
  const age = Date.now() - page.lastUpdateAt;
  if (age > STALE_AFTER_MS) setConnection("stale", `no update for ${duration(age)}`);
  else setConnection("live", "live");
}
setInterval(tick, 500);

// ------------------------------------------------------------------ rendering

function render(o) {
  const node = o.node;
  const role = node.role;
  document.title = `FutureQ · node ${node.node_id} · ${role}`;
  $("node-title").textContent =
    (node.clustered
      ? `node ${node.node_id} · ${role.replace("_", "-")} · term ${node.term}`
      : `node ${node.node_id} · single node`) + (o.shards ? ` · ${o.shards.length} shards` : "");
  $("server-version").textContent = `server ${node.server_version}`;
  const roleCard = $("card-role");
  roleCard.textContent = role.replace("_", "-");
  roleCard.classList.toggle("leader", role === "leader");
  roleCard.classList.toggle("long", role.length > 9);
  $("card-term").textContent = integer(node.term);
  $("card-commit").textContent = integer(node.commit_index);
  $("card-applied").textContent = integer(node.applied_index);
  $("card-disk").textContent = bytes(node.data_dir_bytes);
  $("card-uptime").textContent = duration(node.uptime_s * 1000);
  // The node's totals, not the sum of the groups listed (at most 100 of them); a
  // server before pending_total sends none, and the listed ones are all it has.
  const pending = o.pending_total ?? o.groups.reduce((sum, g) => sum + g.pending, 0);
  const inFlight = o.in_flight_total ?? o.groups.reduce((sum, g) => sum + g.in_flight, 0);
  $("card-pending").textContent = integer(pending);
  $("card-in-flight").textContent = integer(inFlight);

  renderAlarms(o.alarms);
  renderBanner(node);
  renderMembers(o);
  renderShards(o.shards);
  renderGroups(o);
  renderDueBuckets(o.due_buckets);
  renderRates(o.activity);
  renderLateness(o.activity);
}

function renderAlarms(alarms) {
  const box = $("alarms");
  box.replaceChildren(
    ...alarms.map((alarm) => el("div", { class: "alarm", data: { alarm: alarm.name } }, el("b", {}, alarm.name), alarm.text)),
  );
}

function renderBanner(node) {
  const banner = $("view-banner");
  if (node.view === "local") {
    const leader = node.leader_id !== null ? `node ${node.leader_id} at ${node.leader_address}` : "unknown right now";
    const what = node.role === "follower" ? "a follower" : `a ${node.role.replace("_", "-")}`;
    banner.textContent =
      `This is node ${node.node_id}'s local view: it is ${what}, not the leader. Due, in-flight, consumers, oldest-due age, ` +
      `pending by due time, delivery rates, lateness and member progress are known only to the leader ` +
      `(${leader}); open the leader's dashboard for them.`;
    banner.hidden = false;
  } else {
    banner.hidden = true;
  }
}

function renderMembers(o) {
  const tbody = $("members").querySelector("tbody");
  const node = o.node;
  if (!node.clustered) {
    $("cluster-caption").textContent = "this node runs alone";
    tbody.replaceChildren(el("tr", {}, el("td", { colspan: 8, class: "muted" }, "single node: no Raft peers")));
    return;
  }
  const leaderView = node.role === "leader";
  $("cluster-caption").textContent = leaderView
    ? `as seen by the leader, node ${node.node_id}`
    : `membership as seen by node ${node.node_id} (progress is the leader's)`;
  const offsets = (o.clock && o.clock.offsets_ms) || {};
  tbody.replaceChildren(
    ...o.members.map((m) => {
      const offset = m.clock_offset_ms ?? offsets[String(m.node_id)] ?? null;
      let state;
      if (m.reachable === false) state = el("span", { class: "pill down" }, "unreachable");
      else if (m.recovering) state = el("span", { class: "pill" }, "recovering");
      else if (m.reachable === true) state = el("span", { class: "pill ok" }, "ok");
      else state = el("span", { class: "pill" }, "–");
      const bound = o.clock && o.clock.max_clock_offset_ms;
      const offsetClass = offset !== null && bound && Math.abs(offset) > bound / 2 ? "num bad" : "num";
      const row = el(
        "tr",
        { data: { nodeId: m.node_id, reachable: String(m.reachable) } },
        el("td", {}, `${m.node_id}`, m.node_id === node.node_id ? el("span", { class: "muted" }, " (this)") : null),
        el("td", {}, m.leader ? el("span", { class: "pill leader" }, "leader") : m.voter ? "voter" : "learner"),
        el("td", {}, el("code", {}, m.client_address || m.raft_address || "–")),
        el("td", { class: "num", data: { field: "match_index" } }, integer(m.match_index)),
        el("td", { class: m.lag > 1000 ? "num warn" : "num", data: { field: "lag" } }, integer(m.lag)),
        el("td", { class: m.reachable === false ? "num bad" : "num" }, m.last_heard_ms === null || m.last_heard_ms === undefined ? "–" : duration(m.last_heard_ms)),
        el("td", { class: offsetClass }, offset === null ? "–" : `${offset >= 0 ? "+" : ""}${Number(offset).toFixed(1)} ms`),
        el("td", { data: { field: "state" } }, state),
      );
      return row;
    }),
  );
}

// A sharded node (docs/sharding.md, "One operator view"): one row per shard; the cards
// above show shard 0's Raft group, the groups, rates and due buckets are every shard's.
function renderShards(shards) {
  const panel = $("shards-panel");
  panel.hidden = !shards;
  if (!shards) return;
  const down = shards.filter((s) => s.error).length;
  $("shards-caption").textContent =
    `${shards.length} shards on this node` + (down ? `; ${down} not answering` : "") +
    "; cards above are shard 0's Raft group";
  $("shards").querySelector("tbody").replaceChildren(
    ...shards.map((s) =>
      el(
        "tr",
        { data: { shard: s.shard } },
        el("td", {}, `${s.shard}`),
        el("td", {}, s.error ? "–" : s.role === "leader" ? el("span", { class: "pill leader" }, "leader") : (s.role || "–")),
        el("td", { class: "num" }, s.error ? "–" : integer(s.term)),
        el("td", {}, s.error ? "–" : el("code", {}, s.leader_address || "none")),
        el("td", { class: "num" }, s.error ? "–" : integer(s.applied_index)),
        el("td", { class: "num" }, s.error ? "–" : integer(s.groups_total)),
        el("td", { data: { field: "state" } }, s.error ? el("span", { class: "pill down" }, s.error) : el("span", { class: "pill ok" }, "ok")),
      ),
    ),
  );
}

function renderGroups(o) {
  const tbody = $("groups").querySelector("tbody");
  const hidden = o.groups_total - o.groups.length;
  $("groups-caption").textContent =
    `${integer(o.groups_total)} group${o.groups_total === 1 ? "" : "s"}` +
    (hidden > 0 ? `; the ${o.groups.length} with most pending shown` : "");
  if (!o.groups.length) {
    tbody.replaceChildren(el("tr", {}, el("td", { colspan: 11, class: "muted" }, "no topics yet: publish a message to create one")));
    return;
  }
  const numberCell = (field, value, extra = {}) =>
    el("td", { class: extra.class || "num", data: { field, value: value === null ? "" : String(value) } }, extra.text ?? integer(value));
  tbody.replaceChildren(
    ...o.groups.map((g) =>
      el(
        "tr",
        { data: { topic: g.topic, group: g.group } },
        el("td", {}, g.topic),
        el("td", {}, g.group),
        numberCell("pending", g.pending),
        numberCell("due", g.due),
        numberCell("in_flight", g.in_flight),
        numberCell("consumers", g.consumers),
        numberCell("oldest_due_age_ms", g.oldest_due_age_ms, {
          text: duration(g.oldest_due_age_ms),
          class: g.oldest_due_age_ms > 10000 ? "num warn" : "num",
        }),
        numberCell("dead_letters", g.dead_letters, { class: g.dead_letters ? "num bad" : "num" }),
        ...COUNTS_FIELDS.map((field, i) => {
          const known = page.counts.get(groupKey(g.topic, g.group));
          return numberCell(field, known ? known[i] : null);
        }),
      ),
    ),
  );
}

function renderDueBuckets(buckets) {
  const box = $("due-buckets");
  if (!buckets) {
    box.replaceChildren(el("span", { class: "muted" }, "known only to the leader"));
    return;
  }
  const most = Math.max(1, ...buckets.map((b) => b.count));
  box.replaceChildren(
    ...buckets.flatMap((b, i) => [
      el("span", { class: "label" }, b.label),
      el("div", {}, el("div", { class: i === 0 ? "bar overdue" : "bar", style: `width: ${(100 * b.count) / most}%` })),
      el("span", { class: "num", data: { bucket: b.label } }, integer(b.count)),
    ]),
  );
}

// A line chart of per-second series over the last HISTORY_S seconds, newest at the right.
function lineChart(svg, series, { stepS, unit, height = 220, dots = false }) {
  const width = 640;
  const left = 48;
  const right = 8;
  const top = 18;
  const bottom = 24;
  const points = Math.max(2, Math.floor(HISTORY_S / stepS));
  const values = series.flatMap((s) => s.values.filter((v) => v !== null));
  const most = Math.max(1, ...values);
  const y = (v) => top + (height - top - bottom) * (1 - v / most);
  const x = (i) => left + ((width - left - right) * i) / (points - 1);
  const children = [
    svgEl("line", { class: "axis", x1: left, x2: width - right, y1: y(0), y2: y(0) }),
    svgEl("line", { class: "axis", x1: left, x2: width - right, y1: y(most), y2: y(most) }),
    svgEl("text", { x: left - 6, y: y(most) + 4, "text-anchor": "end" }, shortNumber(most, unit)),
    svgEl("text", { x: left - 6, y: y(0) + 4, "text-anchor": "end" }, "0"),
    svgEl("text", { x: left, y: 11 }, unit),
  ];
  for (let minute = 0; minute <= HISTORY_S / 60; minute++) {
    const i = points - 1 - (minute * 60) / stepS;
    if (i < 0) break;
    children.push(
      svgEl("text", { x: x(i), y: height - 6, "text-anchor": minute === 0 ? "end" : "middle" }, minute === 0 ? "now" : `−${minute} min`),
    );
  }
  for (const s of series) {
    const offset = points - s.values.length;
    let path = "";
    s.values.forEach((v, i) => {
      if (v === null) return;
      path += `${path && s.values[i - 1] !== null ? "L" : "M"}${x(offset + i).toFixed(1)},${y(v).toFixed(1)}`;
    });
    if (path) children.push(svgEl("path", { d: path, fill: "none", stroke: s.color, "stroke-width": 1.8 }));
    s.values.forEach((v, i) => {
      // Every point of a sparse series, and the newest point of any (so that a series
      // of one point is seen at all).
      if (v !== null && (dots || i === s.values.length - 1)) {
        children.push(svgEl("circle", { cx: x(offset + i), cy: y(v), r: 2.5, fill: s.color }));
      }
    });
  }
  if (!values.length) {
    children.push(svgEl("text", { class: "empty", x: width / 2, y: height / 2, "text-anchor": "middle" }, "no data yet"));
  }
  svg.replaceChildren(...children);
}

function shortNumber(n, unit) {
  if (unit === "ms") return latenessLabel(n).replace("≤", "");
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)}M`;
  if (n >= 1e4) return `${Math.round(n / 1e3)}k`;
  return `${Math.round(n * 10) / 10}`;
}

function legend(box, series) {
  box.replaceChildren(
    ...series.map((s) => el("span", { style: `--swatch: ${s.color}`, data: { series: s.key } }, `${s.name}: ${s.now}`)),
  );
}

function cssColor(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function renderRates(activity) {
  const last = (values) => (values.length ? values[values.length - 1] : 0);
  const series = [
    { key: "published", name: "published/s", color: cssColor("--published"), values: activity.published },
    { key: "delivered", name: "delivered/s", color: cssColor("--delivered"), values: activity.delivered },
    { key: "acked", name: "acked/s", color: cssColor("--acked"), values: activity.acked },
    { key: "dead_lettered", name: "dead-lettered/s", color: cssColor("--dead"), values: activity.dead_lettered },
  ];
  lineChart($("chart-rates"), series, { stepS: activity.step_s, unit: "msg/s", height: 320 });
  legend($("legend-rates"), series.map((s) => ({ ...s, now: integer(last(s.values)) })));
}

function renderLateness(activity) {
  const svg = $("chart-lateness");
  const width = 640;
  const height = 180;
  const counts = activity.lateness_counts;
  const bounds = activity.lateness_bounds_ms;
  const total = counts.reduce((a, b) => a + b, 0);
  const left = 8;
  const bottom = 34;
  const top = 16;
  const barWidth = (width - 2 * left) / counts.length;
  const most = Math.max(1, ...counts);
  const children = [svgEl("line", { class: "axis", x1: left, x2: width - left, y1: height - bottom, y2: height - bottom })];
  counts.forEach((count, i) => {
    const h = ((height - top - bottom) * count) / most;
    const bar = svgEl("rect", {
      x: left + i * barWidth + 2,
      y: height - bottom - h,
      width: barWidth - 4,
      height: Math.max(h, count ? 1 : 0),
      fill: bounds[i] === null || bounds[i] > 1000 ? cssColor("--p99") : cssColor("--delivered"),
      rx: 2,
    });
    bar.append(svgEl("title", {}, `${latenessLabel(bounds[i])}: ${integer(count)} deliveries`));
    children.push(bar);
    if (i % 2 === 0 || counts.length < 10) {
      children.push(svgEl("text", { x: left + (i + 0.5) * barWidth, y: height - bottom + 14, "text-anchor": "middle" }, latenessLabel(bounds[i]).replace("≤", "")));
    }
    if (count) {
      children.push(svgEl("text", { x: left + (i + 0.5) * barWidth, y: height - bottom - h - 3, "text-anchor": "middle" }, shortNumber(count)));
    }
  });
  if (!total) {
    children.push(svgEl("text", { class: "empty", x: width / 2, y: height / 2, "text-anchor": "middle" }, "no deliveries in the last 5 minutes"));
  }
  svg.replaceChildren(...children);
  const p50 = activity.lateness_p50_ms.filter((v) => v !== null);
  const p99 = activity.lateness_p99_ms.filter((v) => v !== null);
  const lastOf = (values) => (values.length ? latenessLabel(values[values.length - 1]) : "–");
  lineChart(
    $("chart-lateness-time"),
    [
      { key: "p50", color: cssColor("--p50"), values: activity.lateness_p50_ms },
      { key: "p99", color: cssColor("--p99"), values: activity.lateness_p99_ms },
    ],
    { stepS: activity.lateness_window_s, unit: "ms", height: 110, dots: true },
  );
  legend($("legend-lateness"), [
    { key: "deliveries", name: "deliveries", color: cssColor("--delivered"), now: integer(total) },
    { key: "p50", name: `p50 (last ${activity.lateness_window_s} s)`, color: cssColor("--p50"), now: lastOf(p50) },
    { key: "p99", name: `p99 (last ${activity.lateness_window_s} s)`, color: cssColor("--p99"), now: lastOf(p99) },
  ]);
}

connect();
