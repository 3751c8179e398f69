// cudaleak's HTML report. Written for this page: it draws the timeline,
// the flame graphs (icicles) and the leak table from the JSON in
// #cudaleak-data with DOM calls only. Text from the report is set with
// textContent / createTextNode, never parsed as markup.
"use strict";
(function () {
  var errors = document.getElementById("errors");
  function showError(msg) {
    errors.appendChild(document.createTextNode(String(msg) + "\n"));
    document.body.setAttribute("data-rendered", "error");
  }
  window.onerror = function (msg, src, line, col) {
    showError("script error: " + msg + " (line " + line + ":" + col + ")");
  };
  window.addEventListener("unhandledrejection", function (e) { showError("script error: " + e.reason); });

  var SVG = "http://www.w3.org/2000/svg";
  var PALETTE = ["#e6550d", "#3182bd", "#31a354", "#756bb1", "#d6616b", "#e7ba52", "#17becf",
    "#8c6d31", "#bd9e39", "#637939", "#843c39", "#7b4173", "#5254a3"];
  var OTHER_COLOR = "#b0b7c3";
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  // As the text report writes sizes (units.rs): 1 decimal, 2 below 10.
  function bytes(n) {
    var a = Math.abs(n), i = 0;
    while (a >= 1024 && i < UNITS.length - 1) { a /= 1024; i++; }
    var s = (i === 0 ? String(a) : a.toFixed(a < 10 ? 2 : 1)) + " " + UNITS[i];
    return (n < 0 ? "-" : "") + s;
  }
  function count(n, noun) { return n + " " + noun + (n === 1 ? "" : "s"); }
  function signedBytes(n) { return (n > 0 ? "+" : "") + bytes(n); }
  function frameText(f) { return f.name + (f.loc ? "  " + f.loc : ""); }
  // A number without float noise: 0.30000000000000004 -> "0.3".
  function round(v) { return String(Number(v.toPrecision(12))); }

  // Round steps (1, 2, 2.5, 5 x 10^k) in one unit, so that every tick
  // reads as a round number in the unit shown (not 19.8 / 39.5 /
  // 59.3 MiB).
  function niceStep(raw, allowQuarter) {
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = allowQuarter ? [1, 2, 2.5, 5, 10] : [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * p >= raw) return steps[i] * p;
    return 10 * p;
  }
  function byteScale(maxv) {
    var i = 0, d = 1;
    while (maxv / d >= 1024 && i < UNITS.length - 1) { d *= 1024; i++; }
    var m = Math.max(maxv / d, 1e-9);
    // The finest round step that needs at most 5 intervals.
    var step = niceStep(m / 5, true);
    while (Math.ceil(m * 1.04 / step - 1e-9) > 5) step = niceStep(step * 1.0001, true);
    if (i === 0) step = Math.max(1, Math.round(step));
    var top = Math.ceil(m * 1.04 / step - 1e-9) * step;
    var ticks = [];
    for (var k = 0; k * step <= top + step * 1e-9; k++) ticks.push({ value: k * step * d, label: round(k * step) + " " + UNITS[i] });
    return { top: top * d, ticks: ticks };
  }
  function timeTicks(spanS) {
    var step = niceStep(Math.max(spanS, 1e-3) / 6, false);
    var out = [];
    for (var k = 0; k * step <= spanS + step * 1e-9; k++) out.push(k * step);
    return { step: step, ticks: out };
  }
  function secs(s, step) {
    var d = step >= 1 ? 0 : Math.min(3, Math.ceil(-Math.log10(step) - 1e-9));
    return "+" + s.toFixed(d) + " s";
  }

  // Labels of a picture never overlap: each takes the first of
  // its candidate places that meets no label placed before it (and no
  // fixed obstacle); one with no free place is hidden, its text left to
  // the tooltip.
  function boxOf(t) {
    var b = t.getBBox();
    return { x: b.x, y: b.y, w: b.width, h: b.height };
  }
  function hit(a, b) {
    return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
  }
  function placeLabels(items, taken, bounds) {
    items.forEach(function (it) {
      var placed = false;
      for (var i = 0; i < it.at.length && !placed; i++) {
        var c = it.at[i];
        it.text.setAttribute("x", c[0]);
        it.text.setAttribute("y", c[1]);
        it.text.setAttribute("text-anchor", c[2] || "start");
        var b = boxOf(it.text);
        var inside = !bounds || (b.x >= bounds.x && b.y >= bounds.y && b.x + b.w <= bounds.x + bounds.w && b.y + b.h <= bounds.y + bounds.h);
        if (inside && !taken.some(function (o) { return hit(o, b); })) { taken.push(b); placed = true; }
      }
      if (!placed) it.text.setAttribute("display", "none");
    });
  }

  // The frames a picture shows. By default what the text report hides
  // (frames the core marks as noise: program start, the interpreter,
  // ctypes and libffi, the test runner's Python frames when the stack has
  // Python frames of its own) is folded away, and a stack with Python
  // frames reads Python-first: its Python frames, then the native code
  // below the innermost one. The toggle shows everything.
  var showAll = false;
  function visibleFrames(frames) {
    if (showAll) return frames;
    var firstPy = -1;
    for (var i = 0; i < frames.length; i++) if (frames[i].python) { firstPy = i; break; }
    var ownPy = frames.some(function (f) { return f.python && !f.noise; });
    return frames.filter(function (f, i) {
      if (f.noise && (!f.python || ownPy)) return false;
      return firstPy < 0 || i <= firstPy || f.python;
    });
  }
  function anyFolded(lists) {
    return lists.some(function (frames) {
      var saved = showAll; showAll = false;
      var v = visibleFrames(frames).length;
      showAll = saved;
      return v !== frames.length;
    });
  }

  // shortName: src/cli/html/short_name.js, shared with the SVG.

  // --- tooltip ---------------------------------------------------------
  var tip = document.getElementById("tooltip");
  function showTip(ev, title, lines) {
    tip.textContent = "";
    tip.appendChild(el("div", { "class": "tip-title" }, title));
    if (lines && lines.length) tip.appendChild(el("pre", null, lines.join("\n")));
    tip.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > window.innerWidth) x = Math.max(0, ev.clientX - w - 14);
    if (y + h > window.innerHeight) y = Math.max(0, ev.clientY - h - 14);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.hidden = true; }
  function stackLines(frames, max) {
    var shown = visibleFrames(frames), out = [];
    for (var i = 0; i < shown.length && i < max; i++) out.push("#" + frames.indexOf(shown[i]) + " " + frameText(shown[i]));
    if (shown.length > max) out.push("... " + count(shown.length - max, "more frame"));
    if (shown.length < frames.length) out.push("(" + count(frames.length - shown.length, "frame") + " of machinery folded away)");
    return out;
  }
  // A stack as a list, folded as the pictures are.
  function stackList(ol, frames, cut) {
    ol.textContent = "";
    var shown = visibleFrames(frames);
    frames.forEach(function (f, i) {
      if (shown.indexOf(f) < 0) return;
      var li = el("li", { "class": f.python ? "py" : "native" });
      li.appendChild(document.createTextNode("#" + i + " " + f.name + (f.python ? " [python]" : "")));
      if (f.loc) li.appendChild(el("span", { "class": "loc" }, "  " + f.loc));
      ol.appendChild(li);
    });
    if (shown.length < frames.length) ol.appendChild(el("li", { "class": "folded" }, "(" + count(frames.length - shown.length, "frame") + " of machinery folded away: \u201cshow every frame\u201d shows them)"));
    if (!frames.length) ol.appendChild(el("li", null, "(no stack recorded)"));
    if (cut) ol.appendChild(el("li", null, "... " + count(cut, "innermost frame") + " not shown"));
  }

  // --- header ------------------------------------------------------------
  function header(data) {
    document.getElementById("title").textContent = data.title;
    var facts = document.getElementById("facts");
    data.facts.forEach(function (f) {
      facts.appendChild(el("dt", null, f[0]));
      facts.appendChild(el("dd", null, f[1]));
    });
    document.getElementById("summary").textContent = data.summary;
  }

  // --- the failed request of an oom report, first ------------------------
  function oom(data) {
    var o = data.oom;
    if (!o) return;
    document.getElementById("oom-section").hidden = false;
    var free = o.device_free_bytes, total = o.device_total_bytes;
    var dev = o.device !== null && o.device !== undefined ? "device " + o.device + ": " : "";
    var mem = free !== null && free !== undefined
      ? dev + "free " + bytes(free) + (total !== null && total !== undefined ? " of " + bytes(total) : "")
      : dev + "free memory unknown";
    var p = document.getElementById("oom-request");
    p.textContent = "";
    p.appendChild(el("strong", { "class": "oom-api" }, o.api));
    p.appendChild(document.createTextNode(" of "));
    p.appendChild(el("strong", { "class": "oom-size", "data-bytes": o.requested_bytes }, bytes(o.requested_bytes)));
    p.appendChild(document.createTextNode(" (" + o.requested_bytes + " bytes) failed ("));
    p.appendChild(el("span", { "class": "oom-device" }, mem));
    p.appendChild(document.createTextNode(")" + (o.failed_calls > 1 ? "; " + o.failed_calls + " failed calls within 1 s" : "") + ", at "));
    p.appendChild(el("span", { "class": "oom-site" }, o.site));
    p.appendChild(document.createTextNode(". Its stack:"));
    stackList(document.getElementById("oom-stack"), o.frames, o.frames_cut);
  }

  // --- timeline: stacked areas of live bytes by call site ------------------
  function timeline(t, data) {
    var section = document.getElementById("timeline-section");
    if (!t || !t.t_ms.length) return;
    section.hidden = false;
    var box = document.getElementById("timeline");
    var W = 1000, H = 300, L = 72, R = 16, T = 34, B = 34;
    var svg = sv("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": "live bytes over time" });
    // In the document before drawing: labels are measured to place them.
    box.appendChild(svg);
    var ts = t.t_ms, n = ts.length;
    var t0 = ts[0], t1 = ts[n - 1];
    (t.ooms || []).forEach(function (o) { t0 = Math.min(t0, o.t_ms); t1 = Math.max(t1, o.t_ms); });
    if (t.report_peak) { t0 = Math.min(t0, t.report_peak.t_ms); t1 = Math.max(t1, t.report_peak.t_ms); }
    var first = t0;
    // One point alone (a single dump) is drawn as a step from the left edge.
    if (t1 === t0) { t0 = t0 - 1000; }
    var ymax = 1;
    for (var i = 0; i < n; i++) {
      var s = 0;
      t.series.forEach(function (se) { s += se.values[i]; });
      ymax = Math.max(ymax, s, t.total[i]);
    }
    if (t.peak) ymax = Math.max(ymax, t.peak.bytes);
    var peakPoint = t.report_peak && t.report_peak.bytes > 0 ? t.report_peak : null;
    var spike = !peakPoint && t.peak && t.process_peak > t.peak.bytes ? t.process_peak : 0;
    if (peakPoint) ymax = Math.max(ymax, peakPoint.bytes);
    ymax = Math.max(ymax, spike);
    var scale = byteScale(ymax);
    var ytop = scale.top;
    function X(ms) { return L + (ms - t0) / (t1 - t0) * (W - L - R); }
    function Y(b) { return H - B - b / ytop * (H - T - B); }
    function since(ms) { return (ms - first) / 1000; }
    var taken = [];
    // grid and axes: round numbers in the unit shown
    var axis = sv("g", { "class": "axis" });
    scale.ticks.forEach(function (tk) {
      var y = Y(tk.value);
      axis.appendChild(sv("line", { "class": "grid", x1: L, x2: W - R, y1: y, y2: y }));
      axis.appendChild(sv("text", { "class": "tick", x: L - 6, y: y + 4, "text-anchor": "end" }, tk.label));
    });
    axis.appendChild(sv("line", { x1: L, x2: W - R, y1: H - B, y2: H - B }));
    var tt = timeTicks((t1 - first) / 1000);
    tt.ticks.forEach(function (s) {
      var x = X(first + s * 1000);
      axis.appendChild(sv("line", { x1: x, x2: x, y1: H - B, y2: H - B + 4 }));
      axis.appendChild(sv("text", { "class": "tick", x: x, y: H - B + 20, "text-anchor": "middle" }, secs(s, tt.step)));
    });
    svg.appendChild(axis);
    // Tick labels that would meet a neighbour are hidden, then they are
    // obstacles for every other label.
    var ticks = Array.prototype.slice.call(axis.querySelectorAll("text"));
    placeLabels(ticks.map(function (tx) {
      return { text: tx, at: [[tx.getAttribute("x"), tx.getAttribute("y"), tx.getAttribute("text-anchor")]] };
    }), taken, { x: 0, y: 0, w: W, h: H });
    // bands, bottom up: the largest site first
    var base = new Array(n).fill(0);
    var xs = ts.map(function (ms) { return X(ms); });
    if (n === 1) xs = [L, xs[0]];
    var legend = document.getElementById("timeline-legend");
    t.series.forEach(function (se, si) {
      var top = base.map(function (b, i) { return b + se.values[i]; });
      var pts = [];
      var lo = n === 1 ? [base[0], base[0]] : base, hi = n === 1 ? [top[0], top[0]] : top;
      // straight lines between points: nothing is known between samples,
      // and the last point must stay visible at the right edge
      for (var i = 0; i < xs.length; i++) pts.push([xs[i], Y(hi[i])]);
      for (var j = xs.length - 1; j >= 0; j--) pts.push([xs[j], Y(lo[j])]);
      var color = se.label === "other" ? OTHER_COLOR : PALETTE[si % PALETTE.length];
      var d = "M" + pts.map(function (p) { return p[0].toFixed(1) + "," + p[1].toFixed(1); }).join("L") + "Z";
      var path = sv("path", { "class": "series", d: d, fill: color, "data-label": se.label });
      var max = Math.max.apply(null, se.values);
      path.addEventListener("mousemove", function (ev) {
        var rect = svg.getBoundingClientRect();
        var x = (ev.clientX - rect.left) / rect.width * W;
        var idx = 0;
        for (var i = 0; i < n; i++) if (X(ts[i]) <= x + 0.5) idx = i;
        var lines = [];
        if (se.why && se.why.length) lines.push("shown as " + se.why.join(", "));
        if (se.partial) lines.push(se.partial);
        showTip(ev, se.label + ": " + bytes(se.values[idx]) + " live at +" + since(ts[idx]).toFixed(2) + " s",
          lines.concat(stackLines(se.stack, 24)));
      });
      path.addEventListener("mouseleave", hideTip);
      svg.insertBefore(path, axis);
      base = top;
      var item = el("span", { "class": "legend-item", "data-label": se.label, "data-max": max });
      if (se.why && se.why.length) {
        item.setAttribute("data-why", se.why.join(", "));
        item.title = "drawn as " + se.why.join(", ");
      }
      item.appendChild(el("span", { "class": "swatch", style: "background:" + color }));
      item.appendChild(el("span", { "class": "legend-label" }, se.label));
      // The figure the table gives for this site, when it is in the table;
      // else the most it held live.
      var fig;
      if (se.group !== undefined && se.group !== null && data.groups[se.group]) {
        var g = data.groups[se.group];
        item.setAttribute("data-group", se.group);
        fig = el("span", { "class": "legend-bytes", "data-bytes": g.bytes }, bytes(g.bytes));
        item.appendChild(document.createTextNode(": "));
        item.appendChild(fig);
        item.appendChild(document.createTextNode(" " + (data.weight === "live bytes" ? "live" : "leaked")));
        if (max !== g.bytes) item.appendChild(document.createTextNode(", sampled max " + bytes(max)));
      } else {
        item.appendChild(document.createTextNode(se.label === "other"
          ? (t.other_sites ? " (" + count(t.other_sites, "more call site") + ")" : "") + ": sampled max " + bytes(max)
          : ": sampled max " + bytes(max)));
      }
      // The samples may miss the peak: its exact figure, where the report
      // has one, named as such.
      if (se.at_peak !== undefined && se.at_peak !== null) {
        item.appendChild(document.createTextNode(", at the peak "));
        item.appendChild(el("span", { "class": "legend-peak", "data-bytes": se.at_peak }, bytes(se.at_peak)));
      }
      if (se.partial) item.appendChild(el("span", { "class": "partial" }, " (" + se.partial + ")"));
      legend.appendChild(item);
    });
    if (t.note) {
      var note = document.getElementById("timeline-note");
      note.hidden = false;
      note.textContent = t.note;
    }
    var labels = [];
    // dumps
    (t.marks || []).forEach(function (m) {
      var x = X(m.t_ms);
      var g = sv("g", { "class": "dump-marker trigger-" + m.trigger, "data-trigger": m.trigger });
      g.appendChild(sv("path", { d: "M" + (x - 5) + "," + (T - 12) + "L" + (x + 5) + "," + (T - 12) + "L" + x + "," + (T - 3) + "Z" }));
      g.appendChild(sv("line", { x1: x, x2: x, y1: T - 3, y2: H - B, stroke: "#888", "stroke-width": 0.6, "stroke-dasharray": "2 3" }));
      g.addEventListener("mousemove", function (ev) { showTip(ev, m.label, []); });
      g.addEventListener("mouseleave", hideTip);
      svg.appendChild(g);
    });
    // out-of-memory moments
    (t.ooms || []).forEach(function (o) {
      var x = X(o.t_ms);
      var g = sv("g", { "class": "oom-marker", "data-t-ms": o.t_ms, "data-bytes": o.requested_bytes });
      g.appendChild(sv("line", { x1: x, x2: x, y1: T - 14, y2: H - B }));
      g.appendChild(sv("rect", { x: x - 4, y: T - 22, width: 8, height: 8 }));
      var tx = sv("text", { "class": "marker-label" }, "out of memory");
      g.appendChild(tx);
      labels.push({ text: tx, at: [[x + 7, T - 14, "start"], [x - 7, T - 14, "end"], [x + 7, T + 10, "start"], [x - 7, T + 10, "end"]] });
      var what = o.api + " of " + bytes(o.requested_bytes) + " failed" + (o.failed_calls > 1 ? " (" + o.failed_calls + " failed calls within 1 s)" : "");
      g.addEventListener("mousemove", function (ev) { showTip(ev, "out of memory at +" + since(o.t_ms).toFixed(2) + " s", [what]); });
      g.addEventListener("mouseleave", hideTip);
      svg.appendChild(g);
    });
    // the process's peak at its moment (the report's `peak`)
    if (peakPoint) {
      var ppx = X(peakPoint.t_ms), ppy = Y(peakPoint.bytes);
      var ppg = sv("g", { "class": "process-peak", "data-bytes": peakPoint.bytes, "data-t-ms": peakPoint.t_ms });
      ppg.appendChild(sv("line", { x1: ppx, x2: ppx, y1: ppy, y2: H - B }));
      ppg.appendChild(sv("circle", { cx: ppx, cy: ppy, r: 4 }));
      var ptx = sv("text", { "class": "marker-label" }, "process peak " + bytes(peakPoint.bytes));
      ppg.appendChild(ptx);
      labels.push({ text: ptx, at: [[ppx + 8, ppy - 6, "start"], [ppx - 8, ppy - 6, "end"], [ppx + 8, ppy + 14, "start"], [ppx - 8, ppy + 14, "end"], [ppx + 8, ppy - 20, "start"], [ppx - 8, ppy - 20, "end"]] });
      ppg.addEventListener("mousemove", function (ev) {
        showTip(ev, "process peak: " + bytes(peakPoint.bytes) + " live at +" + since(peakPoint.t_ms).toFixed(2) + " s",
          data.peak ? ["its call sites: the flame graph of the peak"] : []);
      });
      ppg.addEventListener("mouseleave", hideTip);
      svg.appendChild(ppg);
    }
    // the process's peak, when a short spike put it above every point
    if (spike) {
      var sy = Y(spike);
      var sg = sv("g", { "class": "process-peak", "data-bytes": spike });
      sg.appendChild(sv("line", { x1: L, x2: W - R, y1: sy, y2: sy, stroke: "#b3261e", "stroke-width": 0.8, "stroke-dasharray": "1 3" }));
      var stx = sv("text", { "class": "marker-label" }, "process peak " + bytes(spike) + " (between " + (t.source === "sampler" ? "samples" : "dumps") + ")");
      sg.appendChild(stx);
      labels.push({ text: stx, at: [[W - R, sy - 4, "end"], [W - R, sy + 12, "end"], [L + 4, sy - 4, "start"], [L + 4, sy + 12, "start"]] });
      svg.appendChild(sg);
    }
    // the highest point drawn
    if (t.peak) {
      var px = X(t.peak.t_ms), py = Y(t.peak.bytes);
      var pg = sv("g", { "class": "peak-marker", "data-bytes": t.peak.bytes });
      pg.appendChild(sv("line", { x1: px, x2: px, y1: py, y2: H - B }));
      pg.appendChild(sv("circle", { cx: px, cy: py, r: 4, fill: "#b3261e" }));
      var same = peakPoint && peakPoint.bytes === t.peak.bytes;
      if (!same) {
        var hx = sv("text", { "class": "marker-label" }, (spike || peakPoint ? "highest " + (t.source === "sampler" ? "sample " : "dump ") : "peak ") + bytes(t.peak.bytes));
        pg.appendChild(hx);
        labels.push({ text: hx, at: [[px + 8, py - 6, "start"], [px - 8, py - 6, "end"], [px + 8, py + 14, "start"], [px - 8, py + 14, "end"], [px + 8, py + 28, "start"], [px - 8, py + 28, "end"]] });
      }
      pg.addEventListener("mousemove", function (ev) {
        showTip(ev, "peak: " + bytes(t.peak.bytes) + " live", t.peak.sites.map(function (s) { return bytes(s.bytes) + "  " + s.label; }));
      });
      pg.addEventListener("mouseleave", hideTip);
      svg.appendChild(pg);
    }
    placeLabels(labels, taken, { x: 0, y: 0, w: W, h: H });
    if (n === 1) box.appendChild(el("p", { "class": "empty" },
      "One point only: this report holds no sampled timeline (CUDALEAK_TIMELINE) and no earlier dumps were given."));
  }

  // --- flame graph (icicle), root at the top ------------------------------
  var flames = [];
  function flame(o) {
    var box = document.getElementById(o.box);
    var search = document.getElementById(o.search);
    var matchInfo = document.getElementById(o.match);
    var svg = null, root = null, focus = null, W = 1000, ROW = 18, CH = 6.6, KEYED = 10;
    function build() {
      root = { name: "all", loc: null, value: 0, children: [], byName: {}, depth: 0, sites: [] };
      o.groups.forEach(function (g) {
        if (!(g.bytes > 0) || g.uncounted) return;
        root.value += g.bytes;
        var node = root;
        var leafName = g.api + " (" + g.memory + ")" + (g.pytorch_cache_segment ? " PyTorch cache segment" : "");
        var path = visibleFrames(g.frames).slice().reverse().concat([{ name: leafName, loc: null, python: false, leaf: true, cache: g.pytorch_cache_segment }]);
        path.forEach(function (f) {
          // Merged by name, as flame graphs do: one box for a function
          // whichever of its lines made the call.
          var key = (f.python ? "py:" : "c:") + f.name;
          var c = node.byName[key];
          if (!c) {
            c = { name: f.name, loc: f.python || f.leaf ? f.loc : (f.loc || "").replace(/:\d+$/, ""), python: f.python, leaf: !!f.leaf, cache: !!f.cache, value: 0, children: [], byName: {}, parent: node, depth: node.depth + 1, sites: [] };
            node.byName[key] = c;
            node.children.push(c);
          }
          c.value += g.bytes;
          // A leaf says which call sites it stands for, labelled as the
          // table labels them.
          if (f.leaf && g.site) c.sites.push(g.site);
          node = c;
        });
      });
      focus = root;
    }
    function color(n) {
      if (n.leaf) return n.cache ? "#9ecae1" : "#e8a33d";
      var h = 0;
      for (var i = 0; i < n.name.length; i++) h = (h * 31 + n.name.charCodeAt(i)) >>> 0;
      return n.python ? "hsl(" + (95 + h % 40) + ",50%," + (58 + h % 12) + "%)" : "hsl(" + (8 + h % 32) + ",80%," + (58 + h % 12) + "%)";
    }
    function draw() {
      box.textContent = "";
      if (!root.value) {
        box.appendChild(el("p", { "class": "empty" }, "Nothing to draw: no " + o.weight + "."));
        return;
      }
      var maxDepth = 0;
      (function walk(n) { maxDepth = Math.max(maxDepth, n.depth); n.children.sort(function (a, b) { return b.value - a.value; }); n.children.forEach(walk); })(root);
      // As wide as the box in pixels, so that text keeps its size when two
      // graphs stand side by side.
      W = Math.max(320, Math.round(box.getBoundingClientRect().width) || 1000);
      svg = sv("svg", { viewBox: "0 0 " + W + " " + ((maxDepth + 1) * ROW + 2), role: "img", "aria-label": o.label });
      box.appendChild(svg);
      // The width of one character of the frames' (monospace) font.
      var probe = sv("text", { "class": "probe" }, "MMMMMMMMMM");
      svg.appendChild(probe);
      CH = Math.max(4, (probe.getComputedTextLength() || 66) / 10);
      svg.removeChild(probe);
      var re = null;
      if (search.value) {
        try { re = new RegExp(search.value, "i"); } catch (e) { re = null; }
      }
      var matched = 0;
      var narrow = [];
      var ancestors = {};
      for (var a = focus; a; a = a.parent) ancestors[a.depth] = a;
      function label(n, w) {
        var full = n === root ? "all: " + bytes(n.value) : n.name;
        return shortName(full, Math.floor((w - 6) / CH));
      }
      function box1(n, x, w, faded) {
        var isMatch = re && n !== root && re.test(n.name + " " + (n.loc || ""));
        var g = sv("g", { "class": "frame" + (isMatch ? " match" : "") + (faded ? " faded" : "") + (n.leaf && n.cache ? " cache-segment" : ""), "data-name": n.name });
        g.appendChild(sv("rect", { x: x.toFixed(2), y: n.depth * ROW, width: Math.max(0, w - 0.5).toFixed(2), height: ROW - 1, fill: n === root ? "#c9ced8" : color(n) }));
        var text = label(n, w);
        var t = sv("text", { x: (x + 3).toFixed(2), y: n.depth * ROW + 13 }, text);
        if (text) g.appendChild(t);
        if (n !== root && !n.leaf && !faded && text !== n.name) narrow.push({ n: n, w: w, g: g, t: t });
        g.addEventListener("click", function () { focus = n; draw(); });
        g.addEventListener("mousemove", function (ev) {
          var lines = [bytes(n.value) + " (" + (100 * n.value / root.value).toFixed(1) + "% of " + o.weight + ")"];
          if (n.leaf && n.cache) lines.push(data.pytorch_note);
          n.sites.slice(0, 5).forEach(function (s) { lines.push("call site: " + s); });
          if (n.sites.length > 5) lines.push("and " + count(n.sites.length - 5, "more call site"));
          showTip(ev, n.name + (n.loc ? "  " + n.loc : ""), lines);
        });
        g.addEventListener("mouseleave", hideTip);
        svg.appendChild(g);
        return isMatch;
      }
      function place(n, x, w) {
        var onPath = n.depth < focus.depth;
        if (onPath && ancestors[n.depth] !== n) return;
        if (w < 0.3) return;
        if (box1(n, x, w, onPath)) matched += n.value;
        var cx = x;
        var scale = w / n.value;
        n.children.forEach(function (c) {
          var cw = c.value * scale;
          place(c, cx, cw);
          cx += cw;
        });
      }
      // Ancestors of the focus span the full width; the focus too.
      (function placeFrom(n) {
        if (n === focus) { place(n, 0, W); return; }
        box1(n, 0, W, true);
        placeFrom(ancestors[n.depth + 1]);
      })(root);
      keyNarrow(narrow);
      matchInfo.textContent = re ? "matched: " + bytes(Math.min(matched, focus.value)) + " of " + bytes(focus.value) : "";
    }
    // Boxes too narrow for their names: at 60 call sites through one
    // helper, every site's box is. The frames of the program (not the
    // root, not the API's leaf) that hold the most get a number in their
    // box, as much of their name as still fits after it, and a line in
    // the key under the graph with the whole name, its place and its
    // bytes; the rest keep their tooltip. A name that several narrow
    // boxes share (the helper every site calls) tells none of them apart,
    // and is not numbered.
    function keyNarrow(narrow) {
      var seen = {};
      narrow.forEach(function (k) { seen[k.n.name] = (seen[k.n.name] || 0) + 1; });
      narrow = narrow.filter(function (k) { return seen[k.n.name] === 1; });
      narrow.sort(function (a, b) { return b.n.value - a.n.value || a.n.depth - b.n.depth; });
      var keyed = [];
      narrow.forEach(function (k) {
        var num = String(keyed.length + 1);
        // In a smaller font (9px, the CSS's .keyed) with 2 pixels each
        // side, "10" fits a box 15 pixels wide.
        var chars = Math.floor((k.w - 4) / (CH * 9 / 11));
        if (keyed.length >= KEYED || chars < num.length) return;
        var rest = shortName(k.n.name, chars - num.length - 1);
        k.t.textContent = rest ? num + " " + rest : num;
        k.t.setAttribute("class", "keyed");
        if (!k.t.parentNode) k.g.appendChild(k.t);
        k.g.setAttribute("data-key", num);
        keyed.push(k);
      });
      if (!keyed.length) return;
      var ol = el("ol", { "class": "flame-key" });
      keyed.forEach(function (k, i) {
        var n = k.n;
        var li = el("li", { "data-key": String(i + 1), "data-name": n.name, "data-bytes": n.value });
        li.appendChild(el("span", { "class": "key-num" }, String(i + 1)));
        li.appendChild(document.createTextNode(" " + n.name + "  " + bytes(n.value)));
        // The file's name; the whole path on hover.
        if (n.loc) {
          li.title = n.name + "  " + n.loc;
          li.appendChild(el("span", { "class": "loc" }, "  " + n.loc.replace(/^.*\//, "")));
        }
        li.addEventListener("click", function () { focus = n; draw(); });
        ol.appendChild(li);
      });
      box.appendChild(ol);
    }
    search.addEventListener("input", draw);
    document.getElementById(o.reset).addEventListener("click", function () { focus = root; search.value = ""; draw(); });
    build();
    draw();
    flames.push(function () { build(); draw(); });
  }

  // --- the table ----------------------------------------------------------
  function table(data) {
    var wrap = document.getElementById("table-wrap");
    var title = document.getElementById("table-title");
    var cols;
    if (data.kind === "diff") {
      title.textContent = "Changes, stack by stack";
      cols = [
        { key: "change", label: "change", badge: true },
        { key: "bytes_delta", label: "\u0394 bytes", num: true, fmt: signedBytes },
        { key: "blocks_delta", label: "\u0394 blocks", num: true, fmt: function (v) { return (v > 0 ? "+" : "") + v; } },
        { key: "old_bytes", label: "old", num: true, fmt: bytes },
        { key: "new_bytes", label: "new", num: true, fmt: bytes }];
    } else {
      title.textContent = data.kind === "report" && data.weight === "live bytes" ? "Live memory by call site" : "Leaks";
      cols = [
        { key: "bytes", label: "size", num: true, fmt: bytes },
        { key: "blocks", label: "blocks", num: true }];
    }
    cols = cols.concat([
      { key: "api", label: "API" },
      { key: "memory", label: "memory" }]);
    // Trends exist only where a process was dumped more than once.
    var anyTrend = data.groups.some(function (g) { return g.trend; });
    if (data.kind !== "diff" && anyTrend) cols.push({ key: "trend", label: "trend", badge: true });
    if (data.kind === "merge") cols.push({ key: "ranks", label: "on", fmt: function (v, g) { return (g.only_some ? "only " : "all: ") + v.join(", "); } });
    cols.push({ key: "site", label: "call site" });
    var rows = data.groups.map(function (g, i) {
      var r = Object.assign({}, g);
      // The label that tells this group from the others (the core's, as
      // in the text report); its whole stack is a click away.
      r.site = g.frames.length ? g.site : "(no stack recorded)";
      r.index = i;
      return r;
    });
    var t = el("table", { id: "leaks" });
    var thead = el("thead"), hr = el("tr");
    var sortKey = null, sortDir = -1;
    cols.forEach(function (c) {
      var th = el("th", { "class": c.num ? "num" : "", "data-key": c.key, scope: "col" }, c.label);
      th.addEventListener("click", function () {
        if (sortKey === c.key) sortDir = -sortDir; else { sortKey = c.key; sortDir = c.num ? -1 : 1; }
        Array.prototype.forEach.call(hr.children, function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
        th.classList.add(sortDir > 0 ? "sorted-asc" : "sorted-desc");
        rows.sort(function (a, b) {
          var x = a[c.key], y = b[c.key];
          if (x === y) return a.index - b.index;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * sortDir;
        });
        fill();
      });
      hr.appendChild(th);
    });
    thead.appendChild(hr);
    t.appendChild(thead);
    var tbody = el("tbody");
    t.appendChild(tbody);
    var open = {};
    function fill() {
      tbody.textContent = "";
      rows.forEach(function (r) {
        var tr = el("tr", { "class": "leak-row" + (open[r.index] ? " open" : ""), "data-index": r.index });
        cols.forEach(function (c) {
          var v = r[c.key];
          var td = el("td", { "class": c.num ? "num" : "" });
          if (c.badge) {
            if (v) td.appendChild(el("span", { "class": "badge " + v }, v));
          } else {
            td.textContent = v === null || v === undefined ? "" : c.fmt ? c.fmt(v, r) : String(v);
          }
          // Reserved memory of PyTorch's caching allocator, not a tensor:
          // labelled as the text report labels it.
          if (c.key === "site" && r.pytorch_cache_segment) {
            td.appendChild(document.createTextNode(" "));
            td.appendChild(el("span", { "class": "badge cache-segment", title: data.pytorch_note }, "PyTorch cache segment"));
          }
          if (c.key === "bytes" || c.key === "bytes_delta") td.title = String(v) + " bytes";
          tr.appendChild(td);
        });
        tr.addEventListener("click", function () { open[r.index] = !open[r.index]; fill(); });
        tbody.appendChild(tr);
        if (open[r.index]) {
          var dr = el("tr", { "class": "detail" });
          var td = el("td", { colspan: cols.length });
          var ol = el("ol", { "class": "stack", start: 0 });
          if (r.pytorch_cache_segment) td.appendChild(el("p", { "class": "note" }, data.pytorch_note));
          stackList(ol, r.frames, r.frames_cut);
          td.appendChild(ol);
          dr.appendChild(td);
          tbody.appendChild(dr);
        }
      });
    }
    fill();
    var tfoot = el("tfoot"), fr = el("tr", { id: "totals-row" });
    cols.forEach(function (c, i) {
      var td = el("td", { "class": c.num ? "num" : "" });
      if (c.num) {
        var sum = 0;
        data.groups.forEach(function (g) { if (!(c.key === "bytes" && g.uncounted)) sum += g[c.key] || 0; });
        td.textContent = c.fmt ? c.fmt(sum, {}) : String(sum);
        td.setAttribute("data-sum", sum);
        td.setAttribute("data-key", c.key);
      } else if (i === cols.length - 1) {
        td.textContent = count(data.groups.length, "group") + (data.groups_cut ? " (and " + data.groups_cut + " more not shown)" : "");
      } else if (i === 0 && !c.num) {
        td.textContent = "total";
      }
      fr.appendChild(td);
    });
    tfoot.appendChild(fr);
    t.appendChild(tfoot);
    if (!data.groups.length) wrap.appendChild(el("p", { "class": "empty" }, "No leaks."));
    wrap.appendChild(t);
    if (data.pytorch_hint) {
      var hint = document.getElementById("pytorch-hint");
      hint.hidden = false;
      hint.textContent = data.pytorch_hint;
    }
    return fill;
  }

  // --- ranks side by side (merge) ----------------------------------------
  function ranks(data) {
    if (!data.ranks || !data.ranks.length) return;
    document.getElementById("ranks-section").hidden = false;
    var box = el("div", { "class": "ranks" });
    var max = 1;
    data.ranks.forEach(function (r) { max = Math.max(max, r.leaked_bytes); });
    data.ranks.forEach(function (r) {
      var d = el("div", { "class": "rank" + (r.outlier ? " outlier" : ""), "data-label": r.label });
      var h = el("div", null);
      h.appendChild(el("strong", null, r.label));
      if (r.outlier) { h.appendChild(document.createTextNode(" ")); h.appendChild(el("span", { "class": "badge odd" }, "odd one out")); }
      d.appendChild(h);
      d.appendChild(el("div", { "class": "mono" }, bytes(r.leaked_bytes) + " in " + count(r.leaked_blocks, "block") + ", " + count(r.groups, "group")));
      d.appendChild(el("div", { "class": "mono" }, "pid " + r.pid + (r.hostname ? " on " + r.hostname : "")));
      var bar = el("div", { "class": "bar" }), fill = el("div");
      fill.style.width = (100 * r.leaked_bytes / max).toFixed(1) + "%";
      bar.appendChild(fill);
      d.appendChild(bar);
      box.appendChild(d);
    });
    document.getElementById("ranks").appendChild(box);
  }


  try {
    var data = JSON.parse(document.getElementById("cudaleak-data").textContent);
    // Frames are stored once (data.frames) and referred to by index.
    var resolve = function (ix) { return ix.map(function (i) { return data.frames[i]; }); };
    data.groups.forEach(function (g) { g.frames = resolve(g.frames); });
    if (data.timeline) data.timeline.series.forEach(function (s) { s.stack = resolve(s.stack); });
    if (data.oom) data.oom.frames = resolve(data.oom.frames);
    if (data.peak) data.peak.groups.forEach(function (g) { g.frames = resolve(g.frames); });
    if (data.full_stacks) {
      showAll = true;
      document.getElementById("show-all-frames").checked = true;
    }
    header(data);
    oom(data);
    ranks(data);
    var stacks = data.groups.map(function (g) { return g.frames; });
    if (data.peak) data.peak.groups.forEach(function (g) { stacks.push(g.frames); });
    if (data.oom) stacks.push(data.oom.frames);
    if (showAll || anyFolded(stacks)) document.getElementById("frames-toggle").hidden = false;
    timeline(data.timeline, data);
    if (data.peak && data.peak.groups.length) {
      document.getElementById("peak-flame-section").hidden = false;
      document.getElementById("flames").className = "two";
      document.getElementById("peak-flame-title").textContent = "Flame graph of the peak: " + bytes(data.peak.bytes) + " live" +
        (data.peak.groups_left_out ? " (" + count(data.peak.groups_left_out, "more group") + ", " + bytes(data.peak.bytes_left_out) + ", not drawn)" : "");
    }
    document.getElementById("flame-title").textContent = "Flame graph of " + data.weight;
    flame({ box: "flame", search: "flame-search", reset: "flame-reset", match: "flame-match", groups: data.groups, weight: data.weight, label: "flame graph" });
    if (data.peak && data.peak.groups.length) {
      flame({ box: "peak-flame", search: "peak-flame-search", reset: "peak-flame-reset", match: "peak-flame-match", groups: data.peak.groups, weight: "live bytes at the peak", label: "flame graph of the peak" });
    }
    var refill = table(data);
    document.getElementById("show-all-frames").addEventListener("change", function (ev) {
      showAll = ev.target.checked;
      flames.forEach(function (f) { f(); });
      if (data.oom) stackList(document.getElementById("oom-stack"), data.oom.frames, data.oom.frames_cut);
      if (refill) refill();
    });
    if (document.body.getAttribute("data-rendered") !== "error") document.body.setAttribute("data-rendered", "ok");
  } catch (e) {
    showError("cannot draw this report: " + (e && e.stack ? e.stack : e));
  }
})();
