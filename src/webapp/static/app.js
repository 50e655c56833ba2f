// The daylog Mini App: plain JavaScript, no build step. Every request carries the
// Mini App's initData (`Authorization: tma …`); user text is only ever set as text.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const all = JSON.parse($("labels").textContent);
  const hash = new URLSearchParams(location.hash.slice(1));
  const tg = window.Telegram && window.Telegram.WebApp;
  const initData = (tg && tg.initData) || hash.get("tgWebAppData") || "";
  let lang = "en";
  try {
    const user = JSON.parse(new URLSearchParams(initData).get("user") || "{}");
    if (String(user.language_code || "").startsWith("ru")) lang = "ru";
  } catch (_) { /* no user: English */ }
  const t = (key, n, m) => (all[lang][key] || key).replace("{n}", n).replace("{m}", m);

  function theme() {
    const webApp = window.Telegram && window.Telegram.WebApp;
    let params = (webApp && webApp.themeParams) || {};
    if (!params.bg_color) {
      try { params = JSON.parse(hash.get("tgWebAppThemeParams") || "{}"); } catch (_) { params = {}; }
    }
    for (const [key, value] of Object.entries(params)) {
      if (/^#[0-9a-fA-F]{6}$/.test(value)) {
        document.documentElement.style.setProperty("--tg-theme-" + key.replace(/_/g, "-"), value);
      }
    }
  }

  function label() {
    document.documentElement.lang = lang;
    document.title = t("title");
    for (const el of document.querySelectorAll("[data-label]")) el.textContent = t(el.dataset.label);
    for (const el of document.querySelectorAll("[data-hint]")) el.placeholder = t(el.dataset.hint);
    for (const el of document.querySelectorAll("[data-days]")) el.textContent = t("days", el.dataset.days);
  }

  function refuse() {
    $("app").hidden = true;
    const notice = $("notice");
    notice.textContent = t("no_auth");
    notice.hidden = false;
    document.body.dataset.state = "refused";
  }

  async function api(path, options) {
    const response = await fetch("/app/api/" + path, Object.assign({}, options, {
      headers: Object.assign({ Authorization: "tma " + initData }, (options || {}).headers),
    }));
    document.body.dataset.api = response.status;
    if (response.status === 401) { refuse(); throw new Error("refused"); }
    if (!response.ok) throw new Error("status " + response.status);
    return response;
  }
  const getJson = async (path) => (await api(path)).json();
  const post = async (path, body) => (await api(path, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body || {}),
  })).json();

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = text;
    return node;
  }

  function entryNode(entry) {
    const node = el("article", "entry");
    node.dataset.id = entry.id;
    const when = (entry.day || "") + " · " + entry.time + (entry.zone ? " (" + entry.zone + ")" : "");
    node.append(el("div", "when", when), el("div", "text", entry.text));
    if (entry.analysis) node.append(el("div", "analysis", entry.analysis));
    if (entry.metrics && entry.metrics.line) node.append(el("div", "line", entry.metrics.line));
    return node;
  }

  // ---- the journal, more on scroll ----
  let oldest = null, more = true, loading = false;
  async function loadMore() {
    if (!more || loading) return;
    loading = true;
    try {
      const page = await getJson("entries" + (oldest ? "?before=" + oldest : ""));
      for (const entry of page.entries) $("entries").append(entryNode(entry));
      if (page.entries.length) oldest = page.entries[page.entries.length - 1].id;
      more = page.more;
      if (!more && !$("entries").children.length) $("entries-end").textContent = t("no_entries");
      if (!performance.getEntriesByName("journal-shown").length) {
        performance.mark("journal-shown");
        document.body.dataset.state = "journal";
      }
    } finally { loading = false; }
    if (more && document.body.scrollHeight <= innerHeight + 200) loadMore();
  }
  addEventListener("scroll", () => {
    if (!$("journal").hidden && innerHeight + scrollY >= document.body.scrollHeight - 300) loadMore();
  });

  // ---- me: streak, good days, settings ----
  let me = null;
  async function loadMe() {
    me = await getJson("me");
    if (me.language !== lang) { lang = me.language; label(); }
    $("streak").textContent = me.longest_streak ? t("streak", me.streak, me.longest_streak) : "";
    const list = $("goes-with");
    list.replaceChildren(...me.goes_with.map((g) => el("li", null, g.line)));
    $("goes-with-title").hidden = !me.goes_with.length;
    $("tz").value = me.zone;
    $("reminder").value = me.reminder || "off";
    $("lang").value = me.language;
    $("digest").value = me.digest ? "on" : "off";
  }

  // ---- the calendar: a year in pixels, a day opens its entries ----
  let year = null;
  async function loadYear() {
    const data = await getJson("year" + (year ? "?year=" + year : ""));
    year = data.year;
    $("year-title").textContent = year;
    const moods = new Map(data.days.map((d) => [d.day, d.color]));
    const grid = $("pixels");
    grid.replaceChildren();
    for (let month = 1; month <= 12; month++) {
      grid.append(el("span", "month", String(month).padStart(2, "0")));
      const length = new Date(Date.UTC(year, month, 0)).getUTCDate();
      for (let d = 1; d <= 31; d++) {
        const day = year + "-" + String(month).padStart(2, "0") + "-" + String(d).padStart(2, "0");
        const cell = el("button", "cell");
        if (d > length) { cell.classList.add("none"); grid.append(cell); continue; }
        cell.dataset.day = day;
        cell.title = day;
        cell.style.background = moods.get(day) || (me ? me.no_mood_color : "#dedede");
        if (day > data.today) cell.classList.add("future");
        cell.addEventListener("click", () => openDay(day, cell));
        grid.append(cell);
      }
    }
    document.body.dataset.year = year;
  }
  async function openDay(day, cell) {
    for (const c of document.querySelectorAll(".cell.chosen")) c.classList.remove("chosen");
    if (cell) cell.classList.add("chosen");
    const data = await getJson("days/" + day);
    $("day-title").textContent = day;
    const list = $("day-entries");
    list.replaceChildren(...data.entries.map(entryNode));
    if (!data.entries.length) list.append(el("p", "hint", t("day_none")));
    list.dataset.day = day;
  }
  $("year-prev").addEventListener("click", () => { year -= 1; loadYear(); });
  $("year-next").addEventListener("click", () => { year += 1; loadYear(); });

  // ---- charts: the bot's chart code, in the theme's colours ----
  let chartDays = "30", chartLines = "scores", chartUrl = null;
  function colour(name, fallback) {
    const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return /^#[0-9a-fA-F]{6}$/.test(value) ? value.slice(1) : fallback;
  }
  async function loadChart() {
    const query = new URLSearchParams({
      days: chartDays, lines: chartLines,
      bg: colour("--tg-theme-bg-color", "ffffff"), ink: colour("--tg-theme-text-color", "000000"),
      c1: colour("--tg-theme-button-color", "2ea043"), c2: "d63939", c3: colour("--tg-theme-link-color", "2d6ed2"),
    });
    const blob = await (await api("chart?" + query)).blob();
    if (chartUrl) URL.revokeObjectURL(chartUrl);
    chartUrl = URL.createObjectURL(blob);
    const img = $("chart");
    img.onload = () => { img.dataset.shown = chartLines + "-" + chartDays; };
    img.src = chartUrl;
  }
  function choose(container, attr, value) {
    for (const b of container.querySelectorAll("button")) b.classList.toggle("active", b.dataset[attr] === value);
  }
  $("chart-days").addEventListener("click", (e) => {
    const days = e.target.dataset && e.target.dataset.days;
    if (days) { chartDays = days; choose($("chart-days"), "days", days); loadChart(); }
  });
  $("chart-lines").addEventListener("click", (e) => {
    const lines = e.target.dataset && e.target.dataset.lines;
    if (lines) { chartLines = lines; choose($("chart-lines"), "lines", lines); loadChart(); }
  });

  // ---- search: /search's rules, the words found marked ----
  $("search-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const data = await getJson("search?q=" + encodeURIComponent($("q").value));
    $("search-count").textContent = data.hits.length ? t("search_found", data.matched) : t("search_none");
    $("hits").replaceChildren(...data.hits.map((hit) => {
      const node = el("article", "entry");
      node.dataset.id = hit.id;
      node.append(el("div", "when", hit.day || ""));
      const text = el("div", "text");
      for (const run of hit.runs) text.append(run.matched ? el("mark", null, run.text) : document.createTextNode(run.text));
      node.append(text);
      return node;
    }));
  });

  // ---- settings, export, deletion ----
  for (const form of document.querySelectorAll("form.setting")) {
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const value = form.querySelector("input, select").value;
      $("settings-message").textContent = "";
      try {
        const said = await post("settings", { setting: form.dataset.setting, value: value });
        $("settings-message").textContent = said.message;
        await loadMe();
      } catch (error) { if (error.message !== "refused") $("settings-message").textContent = t("error"); }
    });
  }
  async function toChat(path) {
    $("data-message").textContent = "";
    try { $("data-message").textContent = (await post(path)).message; }
    catch (error) { if (error.message !== "refused") $("data-message").textContent = t("error"); }
  }
  $("export").addEventListener("click", () => toChat("export"));
  $("delete").addEventListener("click", () => { $("delete-ask").hidden = false; });
  $("delete-yes").addEventListener("click", () => { $("delete-ask").hidden = true; toChat("delete"); });

  // ---- tabs ----
  const loaded = {};
  $("tabs").addEventListener("click", async (e) => {
    const tab = e.target.dataset && e.target.dataset.tab;
    if (!tab) return;
    choose($("tabs"), "tab", tab);
    for (const section of document.querySelectorAll("section.tab")) section.hidden = section.id !== tab;
    if (loaded[tab]) return;
    loaded[tab] = true;
    if (tab === "calendar") await loadYear();
    if (tab === "charts") await loadChart();
  });

  theme();
  label();
  // Telegram's script loads without holding the page up; once it is there, tell the
  // client the page is ready, and follow its theme.
  const greet = () => {
    const webApp = window.Telegram && window.Telegram.WebApp;
    if (!webApp) return;
    try {
      webApp.ready();
      webApp.expand();
      webApp.onEvent("themeChanged", () => { theme(); if (loaded.charts) loadChart(); });
    } catch (_) { /* an old client */ }
  };
  if (tg) greet();
  else {
    const script = document.querySelector("script[src*='telegram-web-app']");
    if (script) script.addEventListener("load", greet);
  }
  if (!initData) { refuse(); return; }
  $("app").hidden = false;
  Promise.all([loadMore(), loadMe()]).catch(() => {
    if (document.body.dataset.state !== "refused") $("entries-end").textContent = t("error");
  });
})();
