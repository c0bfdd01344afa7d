// Hover details for call boxes (a click pins them, so a long text can be scrolled), row
// highlighting from the key, and a hidden status element that records how many calls the
// browser drew and whether any script error happened.
(function () {
  "use strict";
  var errors = [];
  var status = document.getElementById("callgrove-status");

  window.addEventListener("error", function (event) {
    errors.push(String(event.message || "error loading " + (event.target && event.target.src)));
    report();
  }, true);
  window.addEventListener("unhandledrejection", function (event) {
    errors.push("unhandled rejection: " + String(event.reason));
    report();
  });
  var consoleError = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, " "));
    report();
    return consoleError.apply(console, arguments);
  };

  var tip = document.getElementById("callgrove-tip");

  function line(className, text) {
    var element = document.createElement("div");
    element.className = className;
    element.textContent = text;
    return element;
  }

  function showTip(details, x, y) {
    tip.replaceChildren();
    tip.appendChild(line("head", details.id + "  ·  seq " + details.seq + "  ·  " + details.purpose));
    tip.appendChild(line("meta", details.agent));
    tip.appendChild(line("counts", "prompt " + details.prompt + " (+" + details.prompt_added +
      ") · completion " + details.completion + " tokens"));
    var place = !details.kept ? "not kept: outside the forest"
      : (details.parent === null ? "root" : "parent " + details.parent) +
        " · " + details.rows.join(", ") + (details.loss ? "" : " · no loss");
    tip.appendChild(line("meta", place));
    var text = document.createElement("pre");
    text.textContent = details.text_source + ":\n" + details.text;
    tip.appendChild(text);
    tip.hidden = false;
    moveTip(x, y);
  }

  function moveTip(x, y) {
    var width = tip.offsetWidth, height = tip.offsetHeight;
    var left = Math.min(x + 14, window.innerWidth - width - 8);
    var top = y + 14 + height > window.innerHeight ? Math.max(8, y - height - 14) : y + 14;
    tip.style.left = Math.max(8, left) + "px";
    tip.style.top = top + "px";
  }

  var pinned = null;

  function hideTip() {
    if (!pinned) {
      tip.hidden = true;
    }
  }

  function unpin() {
    pinned = null;
    tip.classList.remove("pinned");
    tip.hidden = true;
  }

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape") {
      unpin();
    }
  });
  document.addEventListener("click", function (event) {
    if (pinned && !tip.contains(event.target) && !pinned.contains(event.target)) {
      unpin();
    }
  });

  function wireCalls(section, details) {
    section.querySelectorAll("g.call").forEach(function (box) {
      var own = details[box.getAttribute("data-call")];
      var title = box.querySelector("title");
      if (title) {
        title.remove(); // the page's own tip replaces the plain SVG tooltip
      }
      box.setAttribute("tabindex", "0");
      box.addEventListener("mouseenter", function (event) {
        if (!pinned) {
          showTip(own, event.clientX, event.clientY);
        }
      });
      box.addEventListener("mousemove", function (event) {
        if (!pinned) {
          moveTip(event.clientX, event.clientY);
        }
      });
      box.addEventListener("click", function (event) {
        pinned = null;
        showTip(own, event.clientX, event.clientY);
        pinned = box;
        tip.classList.add("pinned");
      });
      box.addEventListener("mouseleave", hideTip);
      box.addEventListener("focus", function () {
        var area = box.getBoundingClientRect();
        showTip(own, area.right, area.top);
      });
      box.addEventListener("blur", hideTip);
    });
  }

  function wireRows(section) {
    var calls = section.querySelectorAll("g.call");
    section.querySelectorAll("g.row-key").forEach(function (key) {
      var row = key.getAttribute("data-row");
      key.addEventListener("mouseenter", function () {
        calls.forEach(function (box) {
          var rows = (box.getAttribute("data-rows") || "").split(" ");
          box.classList.toggle("dimmed", rows.indexOf(row) < 0);
        });
      });
      key.addEventListener("mouseleave", function () {
        calls.forEach(function (box) {
          box.classList.remove("dimmed");
        });
      });
    });
  }

  function visibleCalls() {
    var count = 0;
    document.querySelectorAll("g.call").forEach(function (box) {
      var area = box.getBoundingClientRect();
      if (area.width > 0 && area.height > 0 && getComputedStyle(box).visibility !== "hidden") {
        count += 1;
      }
    });
    return count;
  }

  function report() {
    if (!status) {
      return;
    }
    var total = document.querySelectorAll("g.call").length;
    var visible = visibleCalls();
    status.setAttribute("data-state", errors.length ? "error" : "ready");
    status.setAttribute("data-calls", String(total));
    status.setAttribute("data-visible", String(visible));
    status.setAttribute("data-errors", String(errors.length));
    status.textContent = errors.length
      ? "errors: " + errors.join(" | ")
      : visible + " of " + total + " calls drawn";
  }

  function start() {
    document.querySelectorAll("section.episode").forEach(function (section) {
      var data = section.querySelector("script.call-data");
      wireCalls(section, JSON.parse(data.textContent));
      wireRows(section);
    });
    report();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
