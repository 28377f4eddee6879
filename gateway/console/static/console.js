// enginegate console: reads the admin API with the admin key and renders what it answers.
// Everything is built with DOM calls and textContent (never innerHTML): backend names, health details
// and config errors are shown as text, whatever they contain. The key lives in sessionStorage only.
"use strict";

(() => {
  const STORE = "enginegate.console.key";
  const POLL_MS = 2000;
  const $ = (id) => document.getElementById(id);

  let key = sessionStorage.getItem(STORE);
  let timer = null;
  let polling = false;
  let lastHealth = new Map();

  // ---- small DOM helpers -------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function num(value, digits) {
    if (value === null || value === undefined) return "–";
    if (typeof value !== "number") return String(value);
    return digits === undefined ? String(value) : value.toFixed(digits);
  }

  function announce(text) {
    // Cleared first so that the same message twice is read twice.
    const region = $("announce");
    region.textContent = "";
    window.setTimeout(() => { region.textContent = text; }, 50);
  }

  function clear(node) {
    node.replaceChildren();
    return node;
  }

  // ---- the admin API -----------------------------------------------------------------------------
  class Refused extends Error {}

  async function api(method, path, body, contentType) {
    const headers = { Authorization: `Bearer ${key}` };
    if (body !== undefined) headers["Content-Type"] = contentType || "application/json";
    const response = await fetch(path, {
      method, headers, body, cache: "no-store", credentials: "omit", redirect: "error",
    });
    let doc = null;
    const text = await response.text();
    if (text) {
      try { doc = JSON.parse(text); } catch (_) { doc = { text }; }
    }
    if (response.status === 401 || response.status === 403 || response.status === 429) {
      signOut(`The gateway refused the key (${response.status}): ${errorMessage(doc) || "no reason given"}`);
      throw new Refused(String(response.status));
    }
    return { status: response.status, doc };
  }

  function errorMessage(doc) {
    if (doc && doc.error && typeof doc.error.message === "string") return doc.error.message;
    return null;
  }

  function failed(where, error) {
    if (error instanceof Refused) return;
    where.replaceChildren(el("p", { class: "error", role: "alert" }, `The gateway did not answer: ${error.message}`));
  }

  // ---- sign in and out ---------------------------------------------------------------------------
  async function signIn(candidate) {
    key = candidate;
    document.body.dataset.state = "signing-in";
    try {
      const { status, doc } = await api("GET", "/admin/fleet");
      if (key !== candidate) return;  // signed out (or in again) meanwhile: that one counts
      if (status !== 200) throw new Error(errorMessage(doc) || `status ${status}`);
      sessionStorage.setItem(STORE, key);
      document.body.dataset.state = "signed-in";
      $("login").hidden = true;
      $("console").hidden = false;
      $("signout").hidden = false;
      renderFleet(doc);
      poll();
      $("main").focus();
      announce("Signed in.");
    } catch (error) {
      if (!(error instanceof Refused)) signOut(`Could not reach the gateway: ${error.message}`);
    }
  }

  function signOut(message) {
    key = null;
    document.body.dataset.state = "signed-out";
    sessionStorage.removeItem(STORE);
    if (timer !== null) window.clearTimeout(timer);
    timer = null;
    lastHealth = new Map();
    for (const id of ["fleet-table", "decisions-table"]) clear($(id).tBodies[0]);
    for (const id of ["explain-result", "diff-result", "reload-result", "known-models"]) clear($(id));
    $("updated").textContent = "";
    $("console").hidden = true;
    $("signout").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("admin-key").value = "";
    $("admin-key").focus();
  }

  // ---- live panels -------------------------------------------------------------------------------
  // One loop at a time: a poll asked for while one is running (a reload, the tab shown again) is
  // that one; every poll schedules the next through the one timer.
  async function poll() {
    if (polling || key === null) return;
    polling = true;
    if (timer !== null) window.clearTimeout(timer);
    timer = null;
    try {
      const [fleet, decisions, splits, shadow] = await Promise.all([
        api("GET", "/admin/fleet"), api("GET", "/admin/decisions?limit=50"),
        api("GET", "/admin/splits"), api("GET", "/admin/shadow"),
      ]);
      if (key !== null) {  // not signed out meanwhile: nothing is drawn after that
        if (fleet.status === 200) renderFleet(fleet.doc);
        if (decisions.status === 200) renderDecisions(decisions.doc);
        if (splits.status === 200) renderSplits(splits.doc);
        if (shadow.status === 200) renderShadow(shadow.doc);
        $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}`;
      }
    } catch (error) {
      if (!(error instanceof Refused)) $("updated").textContent = `Not updated: ${error.message}`;
    } finally {
      polling = false;
    }
    if (key !== null && timer === null) timer = window.setTimeout(poll, POLL_MS);
  }

  function healthCell(b) {
    const cell = el("td", {}, el("span", { class: b.healthy ? "ok" : "bad" }, b.healthy ? "healthy" : "unhealthy"));
    if (b.detail) cell.append(el("br"), el("span", { class: "muted" }, b.detail));
    return cell;
  }

  function breakerCell(b) {
    const state = b.breaker || "closed";
    const cls = state === "closed" ? "ok" : state === "open" ? "bad" : "warn";
    const cell = el("td", {}, el("span", { class: cls }, state));
    if (state === "half_open" && typeof b.recovery === "number") {
      cell.append(` (${Math.round(b.recovery * 100)}% of traffic)`);
    }
    return cell;
  }

  function kvCell(b) {
    if (typeof b.kv_cache_usage !== "number") return el("td", { class: "num" }, "–");
    const pct = Math.round(b.kv_cache_usage * 100);
    return el("td", { class: "num" },
      el("meter", { min: 0, max: 1, value: b.kv_cache_usage, "aria-hidden": "true" }), ` ${pct}%`);
  }

  function cachedCell(b) {
    const held = b.exact_blocks !== null && b.exact_blocks !== undefined ? ` (${b.exact_blocks} blocks by the engine's events)` : "";
    const cap = typeof b.cache_capacity_tokens === "number" ? ` of ${b.cache_capacity_tokens}` : "";
    return el("td", { class: "num" }, `${num(b.cached_tokens)}${cap}${held}`);
  }

  function renderFleet(doc) {
    const body = clear($("fleet-table").tBodies[0]);
    const models = new Set();
    const changes = [];
    for (const [name, b] of Object.entries(doc || {})) {
      for (const m of b.models || []) models.add(m);
      const observed = b.observed || {};
      const load = b.load_fresh === false ? " (gateway's count)" : "";
      body.append(el("tr", {},
        el("th", { scope: "row" }, name),
        el("td", {}, b.engine),
        el("td", {}, (b.models || []).join(", ")),
        healthCell(b),
        breakerCell(b),
        el("td", { class: "num" }, `${num(b.running)}${load}`),
        el("td", { class: "num" }, num(b.waiting)),
        el("td", { class: "num" }, num(b.in_flight)),
        kvCell(b),
        cachedCell(b),
        el("td", { class: "num" }, `× ${num(observed.ttft_ratio, 2)}`),
        el("td", { class: "num" },
          observed.tpot_ms === null || observed.tpot_ms === undefined ? "not yet" : `${num(observed.tpot_ms, 2)} ms`,
          ` (${num(observed.samples)} samples)`),
      ));
      const was = lastHealth.get(name);
      if (was !== undefined && was !== b.healthy) {
        changes.push(`${name} is now ${b.healthy ? "healthy" : "unhealthy"}${b.detail && !b.healthy ? `: ${b.detail}` : ""}.`);
      }
      lastHealth.set(name, b.healthy);
    }
    if (changes.length) announce(changes.join(" "));
    const list = $("known-models");
    if (list.children.length !== models.size) {
      clear(list);
      for (const m of [...models].sort()) list.append(el("option", { value: m }));
    }
  }

  function candidateItem(c) {
    return el("li", {},
      el("strong", {}, c.backend),
      ` score ${num(c.score, 3)}${c.meets_budget === false ? ", misses the budget" : ""}; `,
      `TTFT ${num(c.ttft_ms, 1)} ms, TPOT ${num(c.tpot_ms, 2)} ms, end to end ${num(c.e2e_ms, 0)} ms, `,
      `queue ${num(c.queue_ms, 1)} ms, ${num(c.cached_tokens)} cached tokens`);
  }

  function excludedList(excluded) {
    const entries = Object.entries(excluded || {});
    if (!entries.length) return null;
    return el("ul", { class: "excluded" },
      entries.map(([name, why]) => el("li", {}, el("strong", {}, name), `: ${why}`)));
  }

  function renderDecisions(doc) {
    $("decisions-kept").textContent = `the last ${num(doc.kept)}`;
    const body = clear($("decisions-table").tBodies[0]);
    const rows = doc.data || [];
    if (!rows.length) {
      body.append(el("tr", {}, el("td", { colspan: 7 }, "No request has been routed yet.")));
      return;
    }
    for (const d of rows) {
      const req = d.request || {};
      const candidates = d.candidates || [];
      const cell = el("td", {});
      if (candidates.length) cell.append(el("ol", { class: "candidates" }, candidates.map(candidateItem)));
      else cell.append("none");
      const excluded = excludedList(d.excluded);
      if (excluded) cell.append(el("p", {}, "Left out:"), excluded);
      body.append(el("tr", {},
        el("td", {}, new Date(d.at * 1000).toLocaleTimeString()),
        el("th", { scope: "row" }, el("code", {}, d.request_id)),
        el("td", {}, req.model),
        el("td", { class: "num" }, num(req.prompt_tokens)),
        el("td", {}, d.reason),
        el("td", {}, d.rule || "–"),
        cell,
      ));
    }
  }

  // ---- explain -----------------------------------------------------------------------------------
  function explainBody(form) {
    const data = new FormData(form);
    const body = { model: String(data.get("model")).trim() };
    for (const field of ["prompt_tokens", "max_tokens"]) {
      const v = String(data.get(field) || "").trim();
      if (v) body[field] = parseInt(v, 10);
    }
    for (const field of ["ttft_budget_ms", "latency_budget_ms", "tpot_budget_ms"]) {
      const v = String(data.get(field) || "").trim();
      if (v) body[field] = parseFloat(v);
    }
    const tenant = String(data.get("tenant") || "").trim();
    if (tenant) body.tenant = tenant;
    const text = String(data.get("text") || "");
    if (text.trim()) body.messages = [{ role: "user", content: text }];
    return body;
  }

  function candidatesTable(doc) {
    const candidates = doc.candidates || [];
    const terms = [...new Set(candidates.flatMap((c) => Object.keys(c.terms || {})))];
    const head = el("tr", {},
      ["Rank", "Backend", "Score", "Meets budget", "TTFT ms", "TPOT ms", "End to end ms", "Queue ms", "Cached tokens"]
        .map((h) => el("th", { scope: "col" }, h)),
      terms.map((t) => el("th", { scope: "col" }, `${t} term`)));
    const rows = candidates.map((c) => el("tr", {},
      el("td", { class: "num" }, num(c.rank)),
      el("th", { scope: "row" }, c.backend),
      el("td", { class: "num" }, num(c.score, 4)),
      el("td", {}, c.meets_budget ? "yes" : "no"),
      el("td", { class: "num" }, num(c.ttft_ms, 1)),
      el("td", { class: "num" }, num(c.tpot_ms, 2)),
      el("td", { class: "num" }, num(c.e2e_ms, 1)),
      el("td", { class: "num" }, num(c.queue_ms, 1)),
      el("td", { class: "num" }, num(c.cached_tokens)),
      terms.map((t) => el("td", { class: "num" }, num((c.terms || {})[t], 4)))));
    return el("div", { class: "scroll", role: "region", tabindex: 0, "aria-label": "Ranked candidates" },
      el("table", { id: "explain-table" },
        el("caption", {}, "Ranked candidates with their predictions and score terms"),
        el("thead", {}, head), el("tbody", {}, rows)));
  }

  async function explain(event) {
    event.preventDefault();
    const out = $("explain-result");
    const button = event.target.querySelector("button");
    button.disabled = true;
    try {
      const { status, doc } = await api("POST", "/admin/route/explain", JSON.stringify(explainBody(event.target)));
      if (status !== 200) {
        out.replaceChildren(el("p", { class: "error", role: "alert" }, errorMessage(doc) || `Refused (${status}).`));
        return;
      }
      const summary = el("p", {}, "Decision: ", el("strong", {}, doc.reason),
        doc.rule ? ` (rule ${doc.rule})` : "", `, up to ${num(doc.max_attempts)} attempts`,
        doc.retry_after_s ? `, retry after ${num(doc.retry_after_s, 0)} s` : "", ".");
      const excluded = excludedList(doc.excluded);
      // Whatever else the answer carries (the budget applied and its source, the weights...), as it comes.
      const shown = ["reason", "rule", "max_attempts", "retry_after_s", "request", "candidates", "excluded"];
      const rest = Object.fromEntries(Object.entries(doc).filter(([k]) => !shown.includes(k)));
      out.replaceChildren(summary, candidatesTable(doc), excluded ? el("p", {}, "Left out:") : "", excluded || "",
        Object.keys(rest).length ? renderValue(rest, "Explanation", 0) : "");
    } catch (error) {
      failed(out, error);
    } finally {
      button.disabled = false;
    }
  }

  // ---- what-if and reload ------------------------------------------------------------------------
  function isRowList(value) {
    return Array.isArray(value) && value.length > 0
      && value.every((v) => v !== null && typeof v === "object" && !Array.isArray(v));
  }

  function scalar(value) {
    if (value === null || value === undefined) return "–";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  // A row's small nested objects (a few numbers, as a run's failures by reason) as columns of their own
  // ("failures.shed"), so that a table of simulated runs reads as one table; larger ones (a whole backend
  // before and after a change) stay one cell, as compact JSON.
  function flatRow(row) {
    const out = {};
    for (const [k, v] of Object.entries(row)) {
      const small = v !== null && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length <= 6
        && Object.values(v).every((x) => x === null || typeof x !== "object");
      if (small) {
        for (const [sub, value] of Object.entries(v)) out[`${k}.${sub}`] = value;
      } else out[k] = v;
    }
    return out;
  }

  function rowTable(objects, caption) {
    const rows = objects.map(flatRow);
    const columns = [...new Set(rows.flatMap((r) => Object.keys(r)))];
    return el("div", { class: "scroll", role: "region", tabindex: 0, "aria-label": caption },
      el("table", {},
        el("caption", {}, caption),
        el("thead", {}, el("tr", {}, columns.map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, rows.map((r) => el("tr", {}, columns.map((c, i) => {
          const v = r[c];
          const tag = i === 0 ? "th" : "td";
          return el(tag, { scope: i === 0 ? "row" : null, class: typeof v === "number" ? "num" : null }, scalar(v));
        }))))));
  }

  // Any JSON document: lists of objects as tables, other lists as lists, objects as labelled groups.
  function renderValue(value, caption, depth) {
    if (isRowList(value)) return rowTable(value, caption);
    if (Array.isArray(value)) {
      if (!value.length) return el("p", { class: "muted" }, "none");
      return el("ul", {}, value.map((v) => el("li", {}, typeof v === "object" && v !== null ? renderValue(v, caption, depth + 1) : scalar(v))));
    }
    if (value !== null && typeof value === "object") {
      const entries = Object.entries(value);
      if (!entries.length) return el("p", { class: "muted" }, "none");
      if (depth >= 4) return el("code", {}, JSON.stringify(value));
      return el("dl", { class: "doc" }, entries.map(([k, v]) => [
        el("dt", {}, k), el("dd", {}, renderValue(v, `${caption}: ${k}`, depth + 1))]));
    }
    return document.createTextNode(scalar(value));
  }

  function renderDocument(doc, title) {
    const parts = [];
    for (const [name, value] of Object.entries(doc || {})) {
      parts.push(el("h4", {}, name), renderValue(value, `${title}: ${name}`, 0));
    }
    return parts;
  }

  // ---- traffic control: splits and shadow traffic, drawn as the what-if answer is -----------------
  function renderSplits(doc) {
    const rules = Object.entries(doc || {});
    $("splits-result").replaceChildren(...(rules.length === 0
      ? [el("p", {}, "No weighted split is configured.")]
      : rules.flatMap(([rule, split]) => [
        el("h4", {}, `Rule ${rule}: control ${split.control}${split.guarded ? ", guarded" : ""}`),
        rowTable(split.arms, `Arms of rule ${rule}`),
      ])));
  }

  // Nested figures as dotted names (ttft_ms.p50), for a measure-per-row table.
  function dotted(value, prefix, out) {
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      for (const [k, v] of Object.entries(value)) dotted(v, prefix ? `${prefix}.${k}` : k, out);
    } else {
      out[prefix] = value;
    }
    return out;
  }

  function pairTable(group) {
    const primary = dotted(group.primary, "", {});
    const candidate = dotted(group.candidate, "", {});
    const measures = [...new Set([...Object.keys(primary), ...Object.keys(candidate)])];
    const caption = `Rule ${group.rule}: ${group.primary_backend} (primary) against ${group.candidate_backend} (candidate)`;
    return el("div", { class: "scroll", role: "region", tabindex: 0, "aria-label": caption },
      el("table", {},
        el("caption", {}, caption),
        el("thead", {}, el("tr", {}, ["measure", "primary", "candidate"].map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, measures.map((m) => el("tr", {},
          el("th", { scope: "row" }, m),
          ...[primary[m], candidate[m]].map((v) => el("td", { class: typeof v === "number" ? "num" : null }, scalar(v))),
        )))));
  }

  function renderShadow(doc) {
    const groups = (doc && doc.groups) || [];
    if (groups.length === 0) {
      $("shadow-result").replaceChildren(
        el("p", {}, `No shadow comparisons yet (${(doc && doc.in_flight) || 0} mirrored requests running).`));
      return;
    }
    const summary = groups.map((g) => {
      const rest = {};
      for (const [k, v] of Object.entries(g)) if (k !== "primary" && k !== "candidate") rest[k] = v;
      return rest;
    });
    $("shadow-result").replaceChildren(
      el("p", {}, `${doc.pairs} pairs in memory, ${doc.in_flight} running.`),
      rowTable(summary, "Shadow traffic: each rule, primary and candidate"),
      ...groups.map(pairTable));
  }

  // The simulated attainment of each config against the request rate, as an SVG drawn here (no library:
  // nothing is fetched, and the page's policy allows no inline style): one line per config, each with its
  // own colour and dash, the table above holding the same numbers for screen readers.
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
    for (const child of children) node.append(child);
    return node;
  }

  function attainmentPlot(rows) {
    const points = (rows || []).filter((r) => typeof r.rate_rps === "number" && typeof r.within_budget_pct === "number");
    const configs = [...new Set(points.map((r) => r.config))];
    if (points.length < 2) return [];
    const W = 520, H = 260, L = 48, B = 36, T = 12, R = 12;
    const maxX = Math.max(...points.map((r) => r.rate_rps)) || 1;
    const x = (v) => L + (v / maxX) * (W - L - R);
    const y = (v) => T + (1 - v / 100) * (H - T - B);
    const styles = [["#1f5fbf", ""], ["#c0392b", "6 4"], ["#1e8449", "2 3"], ["#7d3c98", "10 3 2 3"]];
    const parts = [
      svg("line", { x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: "#555" }),
      svg("line", { x1: L, y1: y(0), x2: L, y2: y(100), stroke: "#555" }),
      svg("text", { x: L - 6, y: y(100) + 4, "text-anchor": "end", "font-size": 11 }, "100%"),
      svg("text", { x: L - 6, y: y(0) + 4, "text-anchor": "end", "font-size": 11 }, "0%"),
      svg("text", { x: W - R, y: H - 8, "text-anchor": "end", "font-size": 11 }, `${num(maxX, 2)} requests/s`),
    ];
    const legend = [];
    configs.forEach((config, i) => {
      const [colour, dash] = styles[i % styles.length];
      const mine = points.filter((r) => r.config === config).sort((a, b) => a.rate_rps - b.rate_rps);
      const d = mine.map((r, j) => `${j ? "L" : "M"}${x(r.rate_rps).toFixed(1)},${y(r.within_budget_pct).toFixed(1)}`);
      parts.push(svg("path", { d: d.join(" "), fill: "none", stroke: colour, "stroke-width": 2, "stroke-dasharray": dash }));
      for (const r of mine) parts.push(svg("circle", { cx: x(r.rate_rps), cy: y(r.within_budget_pct), r: 3, fill: colour }));
      legend.push(`${config}: ${["solid", "dashed", "dotted", "dash-dot"][i % 4]} line`);
    });
    const label = `Requests within budget (%) against the simulated request rate, per config (${legend.join("; ")})`;
    return [el("figure", { class: "plot" },
      svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": label }, ...parts),
      el("figcaption", {}, label))];
  }

  async function whatIf(event) {
    event.preventDefault();
    const out = $("diff-result");
    const yaml = $("config-yaml").value;
    if (!yaml.trim()) {
      out.replaceChildren(el("p", { class: "error", role: "alert" }, "Paste a config or choose a file first."));
      return;
    }
    const button = event.target.querySelector("button");
    button.disabled = true;
    try {
      // JSON, not application/yaml: the gateway takes only JSON bodies (a cross-site form cannot post one).
      const { status, doc } = await api("POST", "/admin/config/diff", JSON.stringify({ yaml }));
      if (status === 404) {
        out.replaceChildren(el("p", { class: "warn", role: "alert" },
          "The what-if diff is not available on this gateway (POST /admin/config/diff answered 404): it needs a newer enginegate."));
      } else if (status !== 200) {
        out.replaceChildren(el("p", { class: "error", role: "alert" }, errorMessage(doc) || `Refused (${status}).`),
          ...problemsList(doc));
      } else {
        out.replaceChildren(el("h3", {}, "What would change"), ...renderDocument(doc, "What would change"),
          ...attainmentPlot(doc.table));
      }
    } catch (error) {
      failed(out, error);
    } finally {
      button.disabled = false;
    }
  }

  function problemsList(doc) {
    const problems = doc && Array.isArray(doc.problems) ? doc.problems : [];
    if (!problems.length) return [];
    return [el("ul", { class: "problems" }, problems.map((p) => el("li", {}, String(p))))];
  }

  async function reload() {
    const out = $("reload-result");
    const button = $("reload");
    button.disabled = true;
    try {
      const { status, doc } = await api("POST", "/admin/reload");
      if (doc && doc.config) $("config-path").textContent = doc.config;
      if (status === 200) {
        const rest = Object.fromEntries(Object.entries(doc || {}).filter(([k]) => !["status", "config"].includes(k)));
        out.replaceChildren(el("p", { class: "ok" }, `Reloaded from ${doc.config}.`), ...renderDocument(rest, "Reload"));
        announce("The config was reloaded.");
        poll();
      } else if (doc && doc.status === "rejected") {
        out.replaceChildren(
          el("p", { class: "error", role: "alert" },
            `Rejected: ${doc.config} has ${doc.problems.length} problem${doc.problems.length === 1 ? "" : "s"}; the running config is kept.`),
          ...problemsList(doc));
      } else {
        out.replaceChildren(el("p", { class: "error", role: "alert" }, errorMessage(doc) || `Refused (${status}).`));
      }
    } catch (error) {
      failed(out, error);
    } finally {
      button.disabled = false;
    }
  }

  function readFile(event) {
    const file = event.target.files && event.target.files[0];
    if (!file) return;
    const reader = new FileReader();
    reader.addEventListener("load", () => {
      $("config-yaml").value = String(reader.result);
      announce(`Read ${file.name} into the text box.`);
    });
    reader.addEventListener("error", () => {
      $("diff-result").replaceChildren(el("p", { class: "error", role: "alert" }, `Could not read ${file.name}.`));
    });
    reader.readAsText(file);
  }

  // ---- start ---------------------------------------------------------------------------------------
  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const candidate = $("admin-key").value.trim();
      if (candidate) signIn(candidate);
    });
    $("signout").addEventListener("click", () => signOut("Signed out."));
    $("explain-form").addEventListener("submit", explain);
    $("diff-form").addEventListener("submit", whatIf);
    $("config-file").addEventListener("change", readFile);
    $("reload").addEventListener("click", reload);
    document.addEventListener("visibilitychange", () => { if (!document.hidden && key !== null) poll(); });
    if (key) signIn(key);
    else {
      document.body.dataset.state = "signed-out";
      $("admin-key").focus();
    }
  });
})();
