// The label of a flame graph's box, shared by the HTML page and the SVG
// (not cut blindly, as boxes once were to "lay\u2026" and "..oc").
// The most telling part of a name that fits `chars`: the whole name,
// then without its place (" [file:line]", as the SVG's Python frames
// carry it), then without its parameters, then the function without its
// namespaces and classes, then that cut with an ellipsis; nothing rather
// than a stub of under 6 characters ("lay\u2026" told nothing).
function shortName(name, chars) {
  if (name.length <= chars) return name;
  var noLoc = name.replace(/ \[[^\]]*\]$/, "");
  if (noLoc.length <= chars && noLoc.length) return noLoc;
  var noArgs = noLoc.replace(/\(.*\)\s*(const)?\s*$/, "");
  if (noArgs.length <= chars && noArgs.length) return noArgs;
  var parts = noArgs.split("::");
  var last = parts[parts.length - 1] || noArgs;
  if (parts.length > 1 && ("\u2026" + last).length <= chars) return "\u2026" + last;
  if (last.length <= chars) return last;
  if (chars < 7) return "";
  return last.slice(0, chars - 1) + "\u2026";
}
