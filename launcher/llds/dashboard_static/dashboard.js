// llds dashboard page: polls api/state (served by llds.dashboard), keeps the samples and step records
// it was sent, and draws one uPlot chart per panel of the server's layout. Every legend entry carries
// the series' latest value in data-value (and its oldest buffered one in data-first), so tests (and people) can read numbers off the page.
(() => {
  "use strict";
  const POLL_MS = 1000;
  const MAX_SAMPLES = 3600;
  const MAX_HISTORY = 100000;
  const HEIGHT = 170;
  const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];

  const state = { bootId: null, seq: 0, historyTotal: 0, polls: 0, events: [] };
  const samples = { t: [], rows: [] };
  let history = [];
  const charts = new Map(); // panel id -> {el, plotEl, legendEl, sig, plot, panel}
  const sections = new Map(); // section name -> grid element

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
  const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

  function fmt(v, unit) {
    if (v === null || v === undefined) return "–";
    if (unit === "s") {
      const a = Math.abs(v);
      if (a === 0) return "0 s";
      if (a < 1e-3) return `${parseFloat((v * 1e6).toPrecision(3))} µs`;
      if (a < 1) return `${parseFloat((v * 1e3).toPrecision(3))} ms`;
      return `${parseFloat(v.toPrecision(3))} s`;
    }
    const a = Math.abs(v);
    let s;
    if (a === 0) s = "0";
    else if (a >= 1e5 || a < 1e-3) s = v.toExponential(2);
    else if (a >= 100) s = v.toFixed(1);
    else s = String(parseFloat(v.toPrecision(4)));
    return unit === "/s" ? `${s}/s` : s;
  }

  function ago(t, now) {
    if (!t) return "never";
    const d = Math.max(0, now - t);
    return d < 60 ? `${d.toFixed(1)} s ago` : `${(d / 60).toFixed(1)} min ago`;
  }

  // ------------------------------------------------------------------ data
  function ingest(st) {
    if (st.boot_id !== state.bootId) {
      samples.t = [];
      samples.rows = [];
      history = [];
      charts.forEach((c) => c.plot && c.plot.destroy());
      charts.clear();
      sections.clear();
      $("panels").innerHTML = "";
      state.bootId = st.boot_id;
    }
    for (const s of st.samples) {
      samples.t.push(s.t);
      samples.rows.push(s.values);
    }
    if (samples.t.length > MAX_SAMPLES) {
      const cut = samples.t.length - MAX_SAMPLES;
      samples.t.splice(0, cut);
      samples.rows.splice(0, cut);
    }
    history = history.concat(st.history);
    if (history.length > MAX_HISTORY) history = history.slice(history.length - MAX_HISTORY);
    state.seq = st.seq;
    state.historyTotal = st.history_total;
    state.events = st.events || [];
  }

  function panelData(panel) {
    if (panel.source === "history") {
      const xs = history.map((r) => r.step);
      return [xs, ...panel.series.map((k) => history.map((r) => num(r[k])))];
    }
    return [samples.t.slice(), ...panel.series.map((k) => samples.rows.map((r) => num(r[k])))];
  }

  function lastValue(ys) {
    for (let i = ys.length - 1; i >= 0; i--) if (ys[i] !== null) return ys[i];
    return null;
  }

  function firstValue(ys) {
    for (let i = 0; i < ys.length; i++) if (ys[i] !== null) return ys[i];
    return null;
  }

  // ------------------------------------------------------------------ charts
  // One <details> per section; "collapsed" sections start closed and size their charts when opened.
  function sectionEl(name, collapsed) {
    if (!sections.has(name)) {
      const box = document.createElement("details");
      box.open = !collapsed;
      box.dataset.section = name;
      const summary = document.createElement("summary");
      summary.innerHTML = `<h2>${esc(name)}</h2>`;
      const grid = document.createElement("div");
      grid.className = "section";
      box.append(summary, grid);
      box.addEventListener("toggle", resizeAll);
      $("panels").append(box);
      sections.set(name, grid);
    }
    return sections.get(name);
  }

  function resizeAll() {
    charts.forEach((c) => c.plot && c.plotEl.clientWidth && c.plot.setSize({ width: c.plotEl.clientWidth, height: HEIGHT }));
  }

  function swapMarkers(u) {
    const ctx = u.ctx;
    const { left, top, width, height } = u.bbox;
    ctx.save();
    ctx.strokeStyle = "rgba(147, 51, 234, 0.45)";
    ctx.setLineDash([4, 3]);
    ctx.lineWidth = 1;
    for (const ev of state.events) {
      const x = u.valToPos(ev.t, "x", true);
      if (x < left || x > left + width) continue;
      ctx.beginPath();
      ctx.moveTo(x, top);
      ctx.lineTo(x, top + height);
      ctx.stroke();
    }
    ctx.restore();
  }

  function makePlot(c, data) {
    const p = c.panel;
    const stepped = p.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined;
    const opts = {
      width: Math.max(200, c.plotEl.clientWidth),
      height: HEIGHT,
      legend: { show: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: p.source === "metrics" }, y: p.y_range ? { range: () => p.y_range } : {} },
      series: [
        { label: p.source === "history" ? "step" : "time" },
        ...p.series.map((k, i) => ({
          label: k, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, paths: stepped,
          points: { show: data[0].length < 60 },
        })),
      ],
      // Unitless axes keep uPlot's own tick labels (they show as many digits as the ticks differ by).
      axes: [p.source === "history" ? { incrs: STEP_INCRS } : {}, p.unit ? { size: 64, values: (u, vals) => vals.map((v) => fmt(v, p.unit)) } : { size: 64 }],
      hooks: {
        setCursor: [(u) => updateLegend(c, u.cursor.idx)],
        draw: p.source === "metrics" ? [swapMarkers] : [],
      },
    };
    return new uPlot(opts, data, c.plotEl);
  }

  function ensureChart(panel) {
    const sig = JSON.stringify([panel.series, panel.missing, panel.stepped, panel.unit, panel.title, panel.y_range]);
    let c = charts.get(panel.id);
    if (c && c.sig === sig) {
      c.panel = panel;
      return c;
    }
    if (!c) {
      const el = document.createElement("div");
      el.className = "panel";
      el.dataset.panelId = panel.id;
      el.innerHTML = '<div class="title"></div><div class="plot"></div><div class="legend"></div><div class="missing"></div>';
      sectionEl(panel.section, panel.collapsed).append(el);
      c = { el, plotEl: el.querySelector(".plot"), legendEl: el.querySelector(".legend") };
      charts.set(panel.id, c);
    }
    if (c.plot) c.plot.destroy();
    c.plot = null;
    c.sig = sig;
    c.panel = panel;
    c.el.querySelector(".title").textContent = panel.title;
    c.el.dataset.source = panel.source;
    // A panel with some of its series is complete enough; an empty one says what it waits for.
    c.el.querySelector(".missing").textContent =
      !panel.series.length && panel.missing.length ? `no data yet: ${panel.missing.join(", ")}` : "";
    c.legendEl.innerHTML = panel.series.map((k, i) =>
      `<span class="item" data-key="${esc(k)}"><span class="sw" style="background:${COLORS[i % COLORS.length]}"></span>` +
      `${esc(k)} <span class="val" data-key="${esc(k)}">–</span></span>`).join("");
    return c;
  }

  function updateLegend(c, idx) {
    if (!c.data) return;
    const vals = c.legendEl.querySelectorAll(".val");
    c.panel.series.forEach((k, i) => {
      const ys = c.data[i + 1];
      const latest = lastValue(ys);
      const shown = idx === null || idx === undefined ? latest : ys[idx];
      const el = vals[i];
      const first = firstValue(ys);
      el.dataset.value = latest === null ? "" : String(latest);
      el.dataset.first = first === null ? "" : String(first);
      el.textContent = fmt(shown === undefined ? null : shown, c.panel.unit);
    });
  }

  function drawPanel(panel) {
    const c = ensureChart(panel);
    const data = panelData(panel);
    c.data = data;
    const n = data[0].length;
    c.el.dataset.points = String(n);
    c.el.dataset.lastX = n ? String(data[0][n - 1]) : "";
    if (panel.series.length && n) {
      if (!c.plot) c.plot = makePlot(c, data);
      else c.plot.setData(data);
    }
    updateLegend(c, c.plot ? c.plot.cursor.idx : null);
  }

  // ------------------------------------------------------------------ strips
  function renderHeader(st) {
    const step = st.step === null || st.step === undefined ? "–" : st.step;
    $("step").textContent = `step ${step}`;
    $("step").dataset.step = st.step === null || st.step === undefined ? "" : String(st.step);
    const a = $("alarm");
    const names = { 0: "ok", 1: "warning", 2: "ALARM" };
    a.dataset.alarm = st.alarm === null || st.alarm === undefined ? "" : String(st.alarm);
    a.textContent = `LLD alarm: ${st.alarm in names ? names[st.alarm] : "no data"}`;
    const tr = st.services.trainer;
    if (tr && tr.extra && Object.keys(tr.extra).length) {
      $("trainer-status").textContent = Object.entries(tr.extra)
        .filter(([, v]) => typeof v !== "object")
        .slice(0, 6).map(([k, v]) => `${k}=${v}`).join("  ");
    }
    state.polls += 1;
    const u = $("updated");
    u.dataset.polls = String(state.polls);
    u.textContent = `updated ${new Date(st.now * 1000).toLocaleTimeString()} · ${samples.t.length} samples · ${history.length} steps`;
  }

  function renderHealth(services, now) {
    const box = $("health");
    for (const [name, s] of Object.entries(services)) {
      let el = box.querySelector(`[data-service="${name}"]`);
      if (!el) {
        el = document.createElement("div");
        el.className = "svc";
        el.dataset.service = name;
        box.append(el);
      }
      el.dataset.status = s.status;
      const detail = Object.entries(s.detail || {}).filter(([, v]) => typeof v !== "object")
        .slice(0, 4).map(([k, v]) => `${k}=${v}`).join(" ");
      el.title = s.url;
      el.innerHTML = `<span class="name">${esc(name)}</span><span class="status">${esc(s.status)}</span>` +
        ` <span class="muted">${s.poll_ms === null ? "" : s.poll_ms.toFixed(0) + " ms"}</span>` +
        `<div class="detail">${esc(detail)} · ok ${ago(s.last_ok_at, now)}</div>` +
        (s.error ? `<div class="err">${esc(s.error)}</div>` : "");
    }
  }

  function renderEvents(events) {
    const last = events.slice(-5).reverse();
    $("events").dataset.count = String(events.length);
    $("events").textContent = last.length
      ? "weights versions: " + last.map((e) => `${new Date(e.t * 1000).toLocaleTimeString()} ${e.key} ${e.from}→${e.to}`).join(" · ")
      : "";
  }

  // ------------------------------------------------------------------ loop
  async function tick() {
    const q = new URLSearchParams({ since: state.seq, history_since: state.historyTotal });
    if (state.bootId) q.set("boot_id", state.bootId);
    try {
      const r = await fetch(`api/state?${q}`, { cache: "no-store" });
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      const st = await r.json();
      ingest(st);
      renderHeader(st);
      renderHealth(st.services, st.now);
      renderEvents(state.events);
      for (const panel of st.layout) drawPanel(panel);
    } catch (e) {
      $("updated").textContent = `dashboard unreachable: ${e.message}`;
    } finally {
      setTimeout(tick, POLL_MS);
    }
  }

  window.addEventListener("resize", resizeAll);
  tick();
})();
