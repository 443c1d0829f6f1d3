// faultrouter operator console: live updates over server-sent events.
// Pages work without it; it greys out items someone else decided, adds new
// alerts to the feed, and moves progress bars.
(function () {
  "use strict";
  var es = new EventSource("/events");
  // A page left for another must give its stream back: browsers allow six
  // connections per host, and a page kept in the back-forward cache would
  // hold its stream open.
  window.addEventListener("pagehide", function () { es.close(); });
  window.addEventListener("pageshow", function (e) { if (e.persisted) { location.reload(); } });

  es.addEventListener("review", function (e) {
    var d = JSON.parse(e.data);
    var row = document.querySelector('#queue tr[data-task="' + CSS.escape(d.task_id) + '"]');
    if (!row) {
      if (d.state === "open" && document.getElementById("queue")) {
        document.getElementById("new-items").classList.remove("hidden");
      }
      return;
    }
    var holder = row.querySelector(".holder");
    if (holder && d.state === "open") {
      var me = document.getElementById("me");
      var mine = me && d.holder === me.textContent;
      holder.textContent = !d.holder ? "" : (mine ? "claimed by you" : "held by " + d.holder) +
        (d.assigned_by ? " (assigned by " + d.assigned_by + ")" : "") + " until " + d.until;
      if (d.holder && !mine) {
        row.querySelectorAll("form.decision button, form.claim button").forEach(function (b) { b.disabled = true; });
      }
    }
    var state = row.querySelector(".state");
    if (d.state === "decided" || d.state === "closed") {
      row.classList.add("decided");
      row.querySelectorAll("form.decision button").forEach(function (b) { b.disabled = true; });
      if (state) {
        state.textContent = d.state === "closed"
          ? "closed by the router (" + d.outcome + ")" + (d.by ? ", decided by " + d.by : "")
          : "decided by " + d.by + " (" + (d.approve ? "approve" : "reject") + "), waiting for the router";
      }
    }
  });

  es.addEventListener("alert", function (e) {
    var feed = document.querySelector("#alerts tbody");
    if (!feed) { return; }
    var d = JSON.parse(e.data);
    var tr = document.createElement("tr");
    [d.time, d.kind, d.scope, d.key, d.change, d.class, d.task_id, d.reason, d.instance].forEach(function (v) {
      var td = document.createElement("td");
      td.textContent = v || "";
      tr.appendChild(td);
    });
    tr.className = "fresh";
    feed.insertBefore(tr, feed.firstChild);
  });

  es.addEventListener("progress", function (e) {
    var d = JSON.parse(e.data);
    var p = document.getElementById("progress");
    if (!p) { return; }
    if (d.caught_up) { p.remove(); return; }
    var r = document.getElementById("progress-read");
    if (r) { r.textContent = d.read; }
  });

  es.addEventListener("job", function (e) {
    var d = JSON.parse(e.data);
    var row = document.querySelector('#jobs tr[data-job="' + CSS.escape(d.id) + '"]');
    if (!row) { return; }
    var st = row.querySelector(".job-state");
    if (st) { st.textContent = d.state; }
    var pr = row.querySelector(".job-progress");
    if (pr) { pr.textContent = d.sent + " / " + d.total; }
  });

  es.addEventListener("deadletter", function () {
    var n = document.getElementById("new-deadletters");
    if (n) { n.classList.remove("hidden"); }
  });
})();

// Keyboard review on the queue: j/k move, Enter opens the task, c claims,
// a/r start an approval or a rejection: the reason field of the row takes
// the focus; Enter asks to confirm an approval and Enter again sends it; a
// rejection first shows the end-user message, where Enter sends and Esc
// goes back. Every key submits the
// page's own forms, with their CSRF token; the server decides as for a
// click. After a decision the queue comes back with the next item selected.
(function () {
  "use strict";
  var queue = document.getElementById("queue");
  var send = document.getElementById("send-reject");
  if (send) {
    document.addEventListener("keydown", function (e) {
      if (e.key === "Escape") { location.href = "/review"; }
    });
  }
  if (!queue) { return; }
  var rows = Array.prototype.slice.call(queue.querySelectorAll("tbody tr[data-task]"));
  var msg = document.getElementById("keys-msg");
  var cur = -1;
  var afterKey = "faultrouter.review.after";

  function say(text) { if (msg) { msg.textContent = text; } }

  function select(i) {
    if (rows.length === 0) { return; }
    i = Math.max(0, Math.min(rows.length - 1, i));
    if (cur >= 0) { rows[cur].classList.remove("current"); }
    cur = i;
    rows[cur].classList.add("current");
    rows[cur].scrollIntoView({ block: "nearest" });
    say("");
  }

  // after a decision or a claim the page names the task: select the next
  // open item after it (or the claimed one itself). The router may have
  // audited the decision before the page came back, and the item left the
  // queue: then the first of the items that followed it when it was
  // decided (kept in the tab's session storage) that is still here.
  var outcome = document.getElementById("flash");
  var start = 0;
  var done = outcome && outcome.dataset.done, task = outcome && outcome.dataset.task;
  var decision = done === "approve" || done === "reject";
  if (task) {
    var at = indexOf(task);
    if (at >= 0) { start = decision ? at + 1 : at; }
    var after = decision && at < 0 ? followers(task) : [];
    for (var j = 0; j < after.length; j++) {
      var k = indexOf(after[j]);
      if (k >= 0) { start = k; break; }
    }
    while (start < rows.length - 1 && rows[start].classList.contains("decided")) { start++; }
  }
  try { sessionStorage.removeItem(afterKey); } catch (err) { /* no storage */ }
  select(start);

  function indexOf(id) {
    for (var i = 0; i < rows.length; i++) {
      if (rows[i].getAttribute("data-task") === id) { return i; }
    }
    return -1;
  }

  // followers returns the tasks that followed task in the queue when it
  // was decided in this tab, or none
  function followers(task) {
    try {
      var kept = JSON.parse(sessionStorage.getItem(afterKey) || "null");
      if (kept && kept.task === task && Array.isArray(kept.next)) { return kept.next; }
    } catch (err) { /* no storage, or not ours */ }
    return [];
  }

  // a decision sent from the queue keeps the tasks after it for the page
  // that comes back (a rejection's confirmation page comes between)
  queue.addEventListener("submit", function (e) {
    var f = e.target, row = f && f.closest ? f.closest("tr[data-task]") : null;
    if (!row || !f.classList.contains("decision")) { return; }
    var i = rows.indexOf(row), next = [];
    for (var j = i + 1; i >= 0 && j < rows.length; j++) { next.push(rows[j].getAttribute("data-task")); }
    try {
      sessionStorage.setItem(afterKey, JSON.stringify({ task: row.getAttribute("data-task"), next: next }));
    } catch (err) { /* no storage: the first item is selected */ }
  });

  function pending(form) { return form && form.getAttribute("data-action"); }

  function cancel() {
    var f = rows[cur] && rows[cur].querySelector("form.decision");
    if (f) {
      f.removeAttribute("data-action");
      f.removeAttribute("data-confirm");
      f.classList.remove("pending");
    }
    if (document.activeElement) { document.activeElement.blur(); }
    say("");
  }

  function start_(action) {
    var row = rows[cur];
    var f = row.querySelector("form.decision");
    if (!f) {
      var holder = row.querySelector(".holder");
      say("You may not decide " + row.getAttribute("data-task") + " here" +
        (holder && holder.textContent.trim() ? ": " + holder.textContent.trim() : "") + ".");
      return;
    }
    f.setAttribute("data-action", action);
    f.removeAttribute("data-confirm");
    f.classList.add("pending");
    var input = f.querySelector("input[name=reason]");
    input.focus();
    say((action === "approve" ? "Approve " : "Reject ") + row.getAttribute("data-task") +
      ": type the reason, then Enter" + (action === "reject" ? " (the end-user message is shown before it is sent)" : "") + "; Esc cancels.");
  }

  // a key handled on keydown types nothing: its keypress is swallowed too
  // (some input sources send the character as an event of its own)
  var swallow = false;
  document.addEventListener("keypress", function (e) {
    if (swallow) { e.preventDefault(); swallow = false; }
  }, true);
  document.addEventListener("keydown", function (e) {
    swallow = false;
    if (onKey(e)) { swallow = true; }
  });

  // onKey handles a key, true when it did (and prevented its default)
  function onKey(e) {
    if (e.ctrlKey || e.metaKey || e.altKey) { return false; }
    var t = e.target;
    if (t && t.name === "reason" && t.form && t.form.classList.contains("decision")) {
      if (e.key === "Escape") { e.preventDefault(); cancel(); return true; }
      if (e.key === "Enter") {
        e.preventDefault();
        var action = pending(t.form);
        if (!action) { say("Press a (approve) or r (reject) first, or click a button."); return true; }
        if (t.value.trim() === "") { say("A reason is required."); return true; }
        // an approval cannot be taken back: the first Enter asks, the
        // second sends (a rejection is confirmed on its own page)
        if (action === "approve" && t.form.getAttribute("data-confirm") !== t.value) {
          t.form.setAttribute("data-confirm", t.value);
          say("Press Enter again to approve " + t.form.querySelector("input[name=task]").value +
            " with the reason \u201c" + t.value.trim() + "\u201d; it cannot be taken back. Esc cancels.");
          return true;
        }
        t.form.querySelector("button[name=action][value=" + action + "]").click();
        return true;
      }
      return false;
    }
    if (t && (t.tagName === "INPUT" || t.tagName === "SELECT" || t.tagName === "TEXTAREA" || t.isContentEditable)) { return false; }
    if (e.key === "Enter" && t && (t.tagName === "A" || t.tagName === "BUTTON")) { return false; }
    if (rows.length === 0) { return false; }
    switch (e.key) {
      case "j": select(cur + 1); break;
      case "k": select(cur - 1); break;
      case "Enter":
        var link = rows[cur].querySelector("td a");
        if (link) { link.click(); }
        break;
      case "c":
        var claim = rows[cur].querySelector("form.claim button.claim");
        if (claim) {
          claim.click();
        } else if (rows[cur].querySelector("form.claim button.release")) {
          say("You hold " + rows[cur].getAttribute("data-task") + " already; its Release button gives it back.");
        } else {
          say("You may not claim " + rows[cur].getAttribute("data-task") + ".");
        }
        break;
      case "a": start_("approve"); break;
      case "r": start_("reject"); break;
      case "Escape": cancel(); break;
      default: return false;
    }
    e.preventDefault();
    return true;
  }
})();
