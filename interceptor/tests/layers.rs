//! The crate's layers (commands → agent → backends → what they attach to → configuration), held
//! by its imports: each file of `src/` is read for the top-level modules it names (`crate::x`,
//! `crate::{x, y::z}`, `super::` paths that climb to the crate root), and no module may name
//! one of a layer above its own, nor may modules import each other in a circle. Why each layer
//! is where it is: docs/architecture.md ("Layers inside `interceptor`"); how a module is
//! written: CONTRIBUTING.md ("Style").
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// The layers, highest first. A module may import modules of its own layer (without a circle)
/// and of the layers below; every top-level module of the crate is in one.
const LAYERS: &[&[&str]] = &[
    // The command line: its shape (`cli`) and what runs it.
    &["commands", "cli"],
    // The node agent, the CNI installer's runtime, `run`'s record of the one instance it
    // attached, and the cluster's check of every node's agent (`health`, read from the
    // Kubernetes API).
    &["agent", "installer", "state", "health"],
    // The node's pod table and the trait its backends implement (`node`), and the two backends.
    &["node", "ebpf", "iptables"],
    // What they attach to and pin in, and the Kubernetes API client.
    &["netns", "cgroup", "bpffs", "kubernetes"],
    // Below everything: the configuration (the interceptor-config crate), logging, crash
    // points.
    &["config", "logging", "crash_points"],
];

/// Which import breaks a rule, and where.
type Edges = BTreeMap<String, BTreeMap<String, BTreeSet<PathBuf>>>;

#[test]
fn no_module_imports_a_layer_above_its_own_or_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = top_level_modules(&src);
    let layer = |module: &str| {
        LAYERS
            .iter()
            .position(|layer| layer.contains(&module))
            .unwrap_or_else(|| panic!("module {module} is in no layer: add it to LAYERS"))
    };
    for module in &modules {
        layer(module);
    }
    let edges = imports(&src, &modules);

    let mut upward = Vec::new();
    for (from, targets) in &edges {
        for (to, files) in targets {
            if layer(to) < layer(from) {
                upward.push(format!("{from} imports {to} (a layer above) in {files:?}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layers:\n{}",
        upward.join("\n")
    );

    if let Some(circle) = find_circle(&edges) {
        let steps: Vec<String> = circle
            .windows(2)
            .map(|w| format!("{} -> {} in {:?}", w[0], w[1], edges[&w[0]][&w[1]]))
            .collect();
        panic!(
            "modules import each other in a circle:\n{}",
            steps.join("\n")
        );
    }
}

/// The CNI plugin is a client of the agent, never the other way round: which pods are meshed
/// and how is configuration (`config::mesh`) that both read. Only what installs the plugin
/// (`interceptor cni` in `commands`, and the installer's runtime, `installer`) uses the
/// plugin's crate.
#[test]
fn only_the_installer_uses_the_cni_plugins_crate() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut users = Vec::new();
    for file in rust_files(&src) {
        let relative = file.strip_prefix(&src).expect("under src");
        if module_path(relative)
            .is_some_and(|path| ["commands", "installer"].contains(&path[0].as_str()))
        {
            continue;
        }
        let code = without_comments(&fs::read_to_string(&file).expect("reading a source file"));
        if code.contains("interceptor_cni::") || code.contains("interceptor_cni as") {
            users.push(relative.to_owned());
        }
    }
    assert!(
        users.is_empty(),
        "these use interceptor_cni (move what they need into interceptor-config or \
         interceptor-api): {users:?}"
    );
}

/// The test reads imports as the compiler would resolve them.
#[test]
fn imports_are_read_from_every_form_of_path() {
    let modules: BTreeSet<String> = ["agent", "ebpf", "netns", "state", "bpffs"]
        .map(String::from)
        .into();
    let text = "use crate::{\n    ebpf::{self, X},\n    netns::PodNetns,\n};\n\
                // crate::agent in a comment is not an import\n\
                fn f() { crate::state::remove_pins(p); super::super::super::bpffs::x(); }\n\
                fn g() { super::agent::y(); $crate::agent::z(); }";
    let found = references(text, &["ebpf".into(), "pods".into(), "x".into()], &modules);
    assert_eq!(
        found,
        ["bpffs", "ebpf", "netns", "state"].map(String::from).into()
    );
}

/// The crate's top-level modules, as lib.rs declares them (`config` is the re-exported
/// configuration crate).
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    let lib = fs::read_to_string(src.join("lib.rs")).expect("reading lib.rs");
    lib.lines()
        .filter_map(|line| {
            let line = line.trim();
            if let Some(name) = line.strip_prefix("pub mod ").or(line.strip_prefix("mod ")) {
                return Some(name.trim_end_matches(';').to_owned());
            }
            line.strip_prefix("pub use ")
                .and_then(|rest| rest.split(" as ").nth(1))
                .map(|name| name.trim_end_matches(';').to_owned())
        })
        .collect()
}

/// For each top-level module, the other top-level modules its files name, and in which files.
fn imports(src: &Path, modules: &BTreeSet<String>) -> Edges {
    let mut edges = Edges::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).expect("under src");
        let Some(path) = module_path(relative) else {
            continue;
        };
        let text = fs::read_to_string(&file).expect("reading a source file");
        for to in references(&text, &path, modules) {
            if to != path[0] {
                edges
                    .entry(path[0].clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(relative.to_owned());
            }
        }
    }
    edges
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).expect("reading a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The module a file is (`agent/mod.rs` is `agent`, `ebpf/pods/restore.rs` is
/// `ebpf::pods::restore`, `cli_tests.rs` is `cli::tests`); `None` for the crate root.
fn module_path(relative: &Path) -> Option<Vec<String>> {
    let mut path: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    if let Some(tested) = path.last().and_then(|last| last.strip_suffix("_tests")) {
        let tested = tested.to_owned();
        path.pop();
        path.push(tested);
        path.push("tests".into());
    }
    match path.as_slice() {
        [root] if root == "lib" || root == "main" => None,
        _ => Some(path),
    }
}

/// The top-level modules a file at module `path` names: `crate::x...`, `crate::{x, y}` and
/// `super::...` paths that climb to the crate root. Comments are skipped. (A `super::` in an
/// inline module is read as if it were in the file's own module: none climbs to the root.)
fn references(text: &str, path: &[String], modules: &BTreeSet<String>) -> BTreeSet<String> {
    let code = without_comments(text);
    // `$crate::`, `my_crate::`: not this crate's root.
    let preceded_by_ident = |at: usize| {
        code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$')
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        if !preceded_by_ident(at) {
            found.extend(first_segments(&code[at + "crate::".len()..]));
        }
    }
    for (at, _) in code.match_indices("super::") {
        if preceded_by_ident(at) || code[..at].ends_with("super::") {
            continue;
        }
        let mut after = &code[at..];
        let mut climbs = 0;
        while let Some(next) = after.strip_prefix("super::") {
            after = next;
            climbs += 1;
        }
        if climbs == path.len() {
            found.extend(first_segments(after));
        }
    }
    found.retain(|name| modules.contains(name));
    found
}

/// A file's code: each line up to its `//`, if any.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of a path (`ebpf::X` → `ebpf`), or of each item of a group
/// (`{ebpf::{self, X}, netns}` → `ebpf`, `netns`).
fn first_segments(path: &str) -> Vec<String> {
    let ident = |s: &str| {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<String>()
    };
    let Some(group) = path.strip_prefix('{') else {
        return vec![ident(path)];
    };
    let mut items = vec![String::new()];
    let mut depth = 0;
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(String::new());
                continue;
            }
            _ => {}
        }
        items.last_mut().expect("one item at least").push(c);
    }
    items.iter().map(|item| ident(item)).collect()
}

/// A circle of imports, as the modules along it (the first repeated at the end), if there is
/// one.
fn find_circle(edges: &Edges) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        edges: &Edges,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = stack.iter().position(|m| m == module) {
            let mut circle = stack[start..].to_vec();
            circle.push(module.to_owned());
            return Some(circle);
        }
        if done.contains(module) {
            return None;
        }
        stack.push(module.to_owned());
        for to in edges.get(module).into_iter().flat_map(BTreeMap::keys) {
            if let Some(circle) = visit(to, edges, stack, done) {
                return Some(circle);
            }
        }
        stack.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|module| visit(module, edges, &mut Vec::new(), &mut done))
}

/// docs/architecture.md's list of the layers and its account of the pod table's trait and the
/// agent's capabilities are what the code has: a layer, a trait method or a capability added,
/// removed or moved fails here until the page says so.
#[test]
fn the_architecture_page_says_what_the_code_has() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = fs::read_to_string(root.join("../docs/architecture.md"))
        .expect("reading docs/architecture.md");

    let section = page
        .split("## Layers inside `interceptor`")
        .nth(1)
        .expect("the page's section on the layers");
    let documented: Vec<Vec<String>> = section
        .lines()
        .skip_while(|line| !line.starts_with("1. "))
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with(|c: char| c.is_ascii_digit()))
        .map(|line| {
            let names = line.split_once(':').expect("`module`, ...: what it is").0;
            backticked(names)
        })
        .collect();
    let code: Vec<Vec<String>> = LAYERS
        .iter()
        .map(|layer| layer.iter().map(|m| m.to_string()).collect())
        .collect();
    assert_eq!(
        documented, code,
        "the page's layers, highest first, against LAYERS"
    );

    let node = fs::read_to_string(root.join("src/node/mod.rs")).expect("reading node/mod.rs");
    let (methods, types) = trait_items(&node, "pub trait Interception");
    let sentence = between(&page, "`node::Interception`: its types are ", ".");
    let (doc_types, doc_methods) = sentence
        .split_once("its methods are")
        .expect("the sentence names the trait's types, then its methods");
    assert_eq!(
        backticked(doc_types),
        types,
        "the Interception trait's types on the page"
    );
    assert_eq!(
        backticked(doc_methods),
        methods,
        "the Interception trait's methods on the page, in the trait's order"
    );

    let capabilities = fs::read_to_string(root.join("src/agent/capabilities.rs"))
        .expect("reading agent/capabilities.rs");
    let traits: Vec<String> = without_comments(&capabilities)
        .lines()
        .filter_map(|line| line.trim().strip_prefix("pub trait "))
        .map(|rest| rest.split([' ', '{']).next().unwrap_or_default().to_owned())
        .collect();
    let sentence = between(&page, "the agent's capabilities are ", ".");
    assert_eq!(
        backticked(&sentence),
        traits,
        "the agent's capabilities on the page"
    );
}

/// The names in backticks in `text`, in order.
fn backticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|name| name.rsplit("::").next().unwrap_or(name).to_owned())
        .collect()
}

/// The text of `page` after `start`, up to the first `end` after it (sentences on the page
/// are wrapped: line breaks become spaces).
fn between(page: &str, start: &str, end: &str) -> String {
    let flat = page.replace('\n', " ");
    let from = flat
        .find(start)
        .unwrap_or_else(|| panic!("the page says {start:?}"))
        + start.len();
    let rest = &flat[from..];
    rest[..rest.find(end).unwrap_or(rest.len())].to_owned()
}

/// The method and associated type names of the trait declared by `header` in `code`, in order.
fn trait_items(code: &str, header: &str) -> (Vec<String>, Vec<String>) {
    let code = without_comments(code);
    let body = code
        .split(header)
        .nth(1)
        .expect("the trait is declared")
        .split("\n}")
        .next()
        .unwrap_or_default();
    let (mut methods, mut types) = (Vec::new(), Vec::new());
    for line in body.lines() {
        // Items are indented once; their bodies and wrapped signatures further.
        let Some(item) = line.strip_prefix("    ").filter(|l| !l.starts_with(' ')) else {
            continue;
        };
        let name = |rest: &str| {
            rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or_default()
                .to_owned()
        };
        if let Some(rest) = item.strip_prefix("fn ") {
            methods.push(name(rest));
        } else if let Some(rest) = item.strip_prefix("type ") {
            types.push(name(rest));
        }
    }
    (methods, types)
}
