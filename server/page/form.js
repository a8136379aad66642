// Forms generated from a JSON schema: a client tool's result (its output schema) and an
// approval's edited input (the tool's input schema). Strings, numbers, booleans, enums, arrays
// and nested objects, each with a label, its description as help text and, before anything is
// sent, a message a person understands beside a field that will not do. A schema the
// generator cannot render (or none) gets a raw-JSON textarea instead.
"use strict";

const SchemaForm = (() => {
  // Keywords whose meaning a plain form cannot show: the schema falls back to raw JSON.
  const UNSUPPORTED = ["$ref", "oneOf", "anyOf", "allOf", "not", "if", "patternProperties", "const"];
  const SCALARS = ["string", "number", "integer", "boolean"];
  let made = 0; // for unique element ids

  function id(kind) {
    made += 1;
    return "sf-" + kind + "-" + made;
  }

  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  // What a schema is, for the form: a scalar type, "enum", "object", "array", or null (cannot).
  function typeOf(schema) {
    if (!isObject(schema) || UNSUPPORTED.some((key) => key in schema)) return null;
    const choices = schema.enum;
    if (Array.isArray(choices) && choices.length && choices.every((v) => !isObject(v) && !Array.isArray(v))) {
      return "enum";
    }
    let type = schema.type;
    // ["string", "null"]: an optional string, as a form shows it.
    if (Array.isArray(type)) {
      const rest = type.filter((t) => t !== "null");
      type = rest.length === 1 ? rest[0] : null;
    }
    if (SCALARS.includes(type)) return type;
    if (type === "object") return isObject(schema.properties) ? "object" : null;
    if (type === "array") return isObject(schema.items) ? "array" : null;
    return null;
  }

  // Whether the whole schema (every property, every item) can be a form.
  function renderable(schema) {
    const type = typeOf(schema);
    if (type === "object") return Object.values(schema.properties).every(renderable);
    if (type === "array") return renderable(schema.items);
    return type !== null;
  }

  function labelText(schema, name, required) {
    return (schema.title || name) + (required ? " *" : "");
  }

  // ---- the parts every field has: a label, help, a message slot ----------------------------

  // A field's wrapper: its help (the description) and its message, both read by a screen
  // reader with the control (aria-describedby).
  function frame(schema, control, path) {
    const wrap = document.createElement("div");
    wrap.className = "field";
    wrap.dataset.path = path;
    const message = document.createElement("p");
    message.className = "field-error";
    message.id = id("error");
    message.hidden = true;
    const described = [message.id];
    let help = null;
    if (schema.description) {
      help = document.createElement("small");
      help.className = "help";
      help.id = id("help");
      help.textContent = schema.description;
      described.unshift(help.id);
    }
    control.setAttribute("aria-describedby", described.join(" "));
    return { wrap, help, message };
  }

  // Shows (or, with no text, clears) a field's message.
  function showMessage(parts, control, text) {
    parts.message.textContent = text || "";
    parts.message.hidden = !text;
    if (text) control.setAttribute("aria-invalid", "true");
    else control.removeAttribute("aria-invalid");
  }

  function labelled(schema, name, required, control) {
    const label = document.createElement("label");
    label.htmlFor = control.id;
    label.textContent = labelText(schema, name, required);
    return label;
  }

  // A leaf field: `parse(text)` answers { value } or { error }, or { absent } when empty.
  function leaf(schema, name, required, path, control, parse) {
    control.id = id("field");
    control.name = name;
    if (required) control.setAttribute("aria-required", "true");
    const parts = frame(schema, control, path);
    const checkbox = control.type === "checkbox";
    const label = labelled(schema, name, required, control);
    if (checkbox) parts.wrap.append(control, label);
    else parts.wrap.append(label, control);
    if (parts.help) parts.wrap.append(parts.help);
    parts.wrap.append(parts.message);
    const node = {
      element: parts.wrap,
      focus: () => control.focus(),
      fail: (text) => showMessage(parts, control, text),
      find: (segments) => (segments.length ? null : node),
      read(errors) {
        const parsed = parse();
        showMessage(parts, control, parsed.error);
        if (parsed.error) errors.push(node);
        return parsed;
      },
    };
    return node;
  }

  // ---- leaves ------------------------------------------------------------------------------

  function textField(schema, name, required, path, value) {
    const input = document.createElement("input");
    input.type = "text";
    input.autocomplete = "off";
    if (typeof value === "string") input.value = value;
    return leaf(schema, name, required, path, input, () => {
      const text = input.value;
      if (text === "") return required ? { error: "This field is required." } : { absent: true };
      const length = [...text].length;
      if (schema.minLength !== undefined && length < schema.minLength) {
        return { error: "Enter at least " + plural(schema.minLength, "character") + "." };
      }
      if (schema.maxLength !== undefined && length > schema.maxLength) {
        return { error: "Enter at most " + plural(schema.maxLength, "character") + "." };
      }
      return { value: text };
    });
  }

  function numberField(schema, name, required, path, value, integer) {
    const input = document.createElement("input");
    input.type = "text";
    input.autocomplete = "off";
    input.inputMode = integer ? "numeric" : "decimal";
    if (typeof value === "number") input.value = String(value);
    return leaf(schema, name, required, path, input, () => {
      const text = input.value.trim();
      if (text === "") return required ? { error: "This field is required." } : { absent: true };
      if (!/^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(text)) {
        return { error: integer ? "Enter a whole number, like 12." : "Enter a number, like 12 or 3.5." };
      }
      const number = Number(text);
      if (integer && !Number.isInteger(number)) return { error: "Enter a whole number, like 12." };
      return bounded(schema, number);
    });
  }

  // A number's bounds, as sentences.
  function bounded(schema, number) {
    if (schema.minimum !== undefined && number < schema.minimum) {
      return { error: "Enter a number no less than " + schema.minimum + "." };
    }
    if (schema.maximum !== undefined && number > schema.maximum) {
      return { error: "Enter a number no more than " + schema.maximum + "." };
    }
    if (typeof schema.exclusiveMinimum === "number" && number <= schema.exclusiveMinimum) {
      return { error: "Enter a number greater than " + schema.exclusiveMinimum + "." };
    }
    if (typeof schema.exclusiveMaximum === "number" && number >= schema.exclusiveMaximum) {
      return { error: "Enter a number less than " + schema.exclusiveMaximum + "." };
    }
    return { value: number };
  }

  function booleanField(schema, name, required, path, value) {
    const input = document.createElement("input");
    input.type = "checkbox";
    input.checked = value === true;
    return leaf(schema, name, false, path, input, () => ({ value: input.checked }));
  }

  // A choice among the schema's values. A prefilled value outside them is shown, marked, so
  // that the person sees what was there and is told to choose another.
  function enumField(schema, name, required, path, value) {
    const select = document.createElement("select");
    const choices = schema.enum.slice();
    const outside = value !== undefined && !choices.some((choice) => same(choice, value));
    const options = [{ text: "Choose…", value: undefined }]
      .concat(choices.map((choice) => ({ text: display(choice), value: choice })));
    if (outside) options.push({ text: display(value) + " (not allowed)", value, outside: true });
    options.forEach((option, index) => {
      const element = document.createElement("option");
      element.value = String(index);
      element.textContent = option.text;
      if (option.value !== undefined && same(option.value, value)) element.selected = true;
      select.appendChild(element);
    });
    const allowed = "Choose one of: " + choices.map(display).join(", ") + ".";
    return leaf(schema, name, required, path, select, () => {
      const option = options[Number(select.value)];
      if (!option || option.value === undefined) return required ? { error: allowed } : { absent: true };
      if (option.outside) return { error: allowed };
      return { value: option.value };
    });
  }

  // ---- groups ------------------------------------------------------------------------------

  // A group's frame: a fieldset with its legend (the root's fields stand on their own).
  function group(schema, name, required, path, className) {
    const set = document.createElement(name === null ? "div" : "fieldset");
    set.className = className;
    set.dataset.path = path;
    if (name !== null) {
      const legend = document.createElement("legend");
      legend.textContent = labelText(schema, name, required);
      set.appendChild(legend);
    }
    if (schema.description && name !== null) {
      const help = document.createElement("small");
      help.className = "help";
      help.id = id("help");
      help.textContent = schema.description;
      set.setAttribute("aria-describedby", help.id);
      set.appendChild(help);
    }
    const message = document.createElement("p");
    message.className = "field-error";
    message.hidden = true;
    return { set, message };
  }

  function objectField(schema, name, required, path, value) {
    const { set, message } = group(schema, name, required, path, "group");
    const given = isObject(value) ? value : {};
    const needed = new Set(Array.isArray(schema.required) ? schema.required : []);
    // Required fields first (the server's JSON may list properties in any order).
    const keys = Object.keys(schema.properties);
    keys.sort((a, b) => Number(needed.has(b)) - Number(needed.has(a)));
    const children = keys.map((key) => [key, schema.properties[key]]).map(([key, child]) => ({
      key,
      node: field(child, key, needed.has(key), path + "/" + pointerEscape(key), given[key]),
    }));
    for (const child of children) set.appendChild(child.node.element);
    set.appendChild(message);
    const node = {
      element: set,
      focus: () => children.length && children[0].node.focus(),
      fail(text) {
        message.textContent = text || "";
        message.hidden = !text;
      },
      find(segments) {
        if (!segments.length) return node;
        const child = children.find((c) => c.key === segments[0]);
        return child ? child.node.find(segments.slice(1)) : null;
      },
      read(errors) {
        // Keys of the value that the schema does not list stay as they were (an edit changes
        // only what the form shows).
        const out = {};
        for (const [key, kept] of Object.entries(given)) {
          if (!(key in schema.properties)) out[key] = kept;
        }
        let filled = false;
        for (const child of children) {
          const read = child.node.read(errors);
          if (read.absent || read.error) continue;
          out[child.key] = read.value;
          filled = true;
        }
        node.fail("");
        if (!filled && !required && name !== null && !isObject(value)) return { absent: true };
        return { value: out };
      },
    };
    return node;
  }

  function arrayField(schema, name, required, path, value) {
    const { set, message } = group(schema, name === null ? "items" : name, required, path, "list");
    const list = document.createElement("ol");
    const add = document.createElement("button");
    add.type = "button";
    add.dataset.action = "add-item";
    add.textContent = "Add " + (schema.items.title || "an item");
    const items = [];
    const itemLabel = () => (schema.items.title || labelText(schema, name || "item", false).replace(/ \*$/, ""));
    const renumber = () => items.forEach((item, index) => {
      item.remove.setAttribute("aria-label", "Remove " + itemLabel() + " " + (index + 1));
    });
    const append = (initial) => {
      const li = document.createElement("li");
      const node = field(schema.items, itemLabel() + " " + (items.length + 1), true, path + "/" + items.length, initial);
      const remove = document.createElement("button");
      remove.type = "button";
      remove.dataset.action = "remove-item";
      remove.textContent = "Remove";
      const item = { li, node, remove };
      remove.addEventListener("click", () => {
        items.splice(items.indexOf(item), 1);
        li.remove();
        renumber();
        add.focus();
      });
      li.append(node.element, remove);
      list.appendChild(li);
      items.push(item);
      renumber();
      return node;
    };
    for (const initial of Array.isArray(value) ? value : []) append(initial);
    add.addEventListener("click", () => append(undefined).focus());
    set.append(list, add, message);
    const node = {
      element: set,
      focus: () => (items.length ? items[0].node.focus() : add.focus()),
      fail(text) {
        message.textContent = text || "";
        message.hidden = !text;
      },
      find(segments) {
        if (!segments.length) return node;
        const item = items[Number(segments[0])];
        return item ? item.node.find(segments.slice(1)) : null;
      },
      read(errors) {
        const out = [];
        for (const item of items) {
          const read = item.node.read(errors);
          if (!read.absent && !read.error) out.push(read.value);
        }
        let problem = "";
        if (schema.minItems !== undefined && items.length < schema.minItems) {
          problem = "Add at least " + plural(schema.minItems, "item") + ".";
        } else if (schema.maxItems !== undefined && items.length > schema.maxItems) {
          problem = "Keep at most " + plural(schema.maxItems, "item") + ".";
        }
        node.fail(problem);
        if (problem) errors.push(node);
        if (!items.length && !required) return { absent: true };
        return { value: out };
      },
    };
    return node;
  }

  // The field for `schema` (named `name`; null for the root), prefilled with `value` or the
  // schema's default.
  function field(schema, name, required, path, value) {
    const initial = value === undefined ? schema.default : value;
    const shown = name === null ? "value" : name;
    switch (typeOf(schema)) {
      case "object": return objectField(schema, name, required, path, initial);
      case "array": return arrayField(schema, name, required, path, initial);
      case "enum": return enumField(schema, shown, required, path, initial);
      case "boolean": return booleanField(schema, shown, required, path, initial);
      case "number": return numberField(schema, shown, required, path, initial, false);
      case "integer": return numberField(schema, shown, required, path, initial, true);
      default: return textField(schema, shown, required, path, initial);
    }
  }

  // ---- small helpers -----------------------------------------------------------------------

  function plural(count, word) {
    return count + " " + word + (count === 1 ? "" : "s");
  }

  function display(value) {
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function same(a, b) {
    return JSON.stringify(a) === JSON.stringify(b);
  }

  function pointerEscape(key) {
    return key.replace(/~/g, "~0").replace(/\//g, "~1");
  }

  // "/a/b~1c" → ["a", "b/c"].
  function pointerSegments(pointer) {
    if (!pointer || pointer === "/") return [];
    return pointer.replace(/^\//, "").split("/").map((s) => s.replace(/~1/g, "/").replace(/~0/g, "~"));
  }

  // ---- the raw-JSON fallback ---------------------------------------------------------------

  function rawJson(label, value) {
    const control = document.createElement("textarea");
    control.id = id("json");
    control.name = "result";
    control.value = JSON.stringify(value === undefined ? {} : value, null, 2);
    const parts = frame({ description: "Write the value as JSON." }, control, "");
    const title = document.createElement("label");
    title.htmlFor = control.id;
    title.textContent = label + " (JSON)";
    parts.wrap.append(title, control, parts.help, parts.message);
    const node = {
      element: parts.wrap,
      focus: () => control.focus(),
      fail: (text) => showMessage(parts, control, text),
      find: () => node,
      read(errors) {
        try {
          const parsed = { value: JSON.parse(control.value) };
          showMessage(parts, control, "");
          return parsed;
        } catch (error) {
          showMessage(parts, control, "This is not valid JSON: " + error.message);
          errors.push(node);
          return { error: true };
        }
      },
    };
    return node;
  }

  // ---- the form ------------------------------------------------------------------------------

  // A form for `schema` prefilled with `value`: { element, generated, read(), focus(),
  // place(lines) }. `read()` answers { value } or { errors: n } (each shown beside its field,
  // the first focused); `place(lines)` puts the server's "/pointer: message" lines beside
  // their fields and answers those it could not place. `label` names the raw-JSON fallback.
  function build(schema, value, label) {
    const generated = renderable(schema);
    const root = generated ? field(schema, null, true, "", value) : rawJson(label, value);
    const element = document.createElement("div");
    element.className = "schema-form";
    element.dataset.generated = generated ? "yes" : "no";
    element.appendChild(root.element);
    return {
      element,
      generated,
      focus: () => root.focus(),
      read() {
        const errors = [];
        const read = root.read(errors);
        if (errors.length) {
          errors[0].focus();
          return { errors: errors.length };
        }
        return { value: read.absent ? {} : read.value };
      },
      place(lines) {
        const left = [];
        for (const line of lines || []) {
          const match = /^(\/[^:]*): (.*)$/s.exec(line);
          const node = match && root.find(pointerSegments(match[1]));
          if (node) node.fail(match[2]);
          else left.push(line);
        }
        return left;
      },
    };
  }

  return { build, renderable };
})();
