//! `Graph`: inputs, nodes in execution order, outputs; every value carries its
//! `TensorMeta`, its storage identity and (for nodes) the user's source location.

use crate::meta::TensorMeta;
use crate::op::{Aliasing, Op};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// A value in a graph (an input or a node's result), printed `%N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Identity of a storage (the memory a tensor's elements live in), printed `#N`.
/// Two values with the same storage alias each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StorageId(pub u32);

impl fmt::Display for StorageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Where in the user's source an op was called (from `#[track_caller]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SourceLoc {
    /// Source file, as the compiler reports it (shared: every node of a file points
    /// at one string, so copying a node or a graph copies no file names; decoding
    /// shares them too).
    #[serde(deserialize_with = "shared_file")]
    pub file: std::sync::Arc<str>,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
}

impl SourceLoc {
    /// The location of the caller of the enclosing `#[track_caller]` function chain,
    /// or, when that location is in a file an [`AttributeCalls`] guard names, the
    /// location that guard gives (the user's line behind library code).
    #[track_caller]
    pub fn caller() -> SourceLoc {
        let l = std::panic::Location::caller();
        ATTRIBUTIONS.with(|a| {
            let mut cur: Option<SourceLoc> = None;
            for (dir, to) in a.borrow().iter().rev() {
                let file = cur.as_ref().map_or(l.file(), |c| &*c.file);
                if file.strip_prefix(*dir).is_some_and(|rest| rest.starts_with(['/', '\\'])) {
                    cur = Some(to.clone());
                }
            }
            cur.unwrap_or_else(|| SourceLoc { file: interned(l.file()), line: l.line(), col: l.column() })
        })
    }
}

/// The shared string of a compiler-given file name (one allocation per file and
/// thread, however many ops a program records there).
fn interned(file: &'static str) -> std::sync::Arc<str> {
    thread_local! {
        static FILES: std::cell::RefCell<std::collections::HashMap<(usize, usize), std::sync::Arc<str>>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    FILES.with(|f| f.borrow_mut().entry((file.as_ptr() as usize, file.len())).or_insert_with(|| file.into()).clone())
}

/// Deserialize a file name into the string every decoded location of that file
/// shares (per thread; a decoded graph or kernel plan names a few files many times).
fn shared_file<'de, D: serde::Deserializer<'de>>(d: D) -> Result<std::sync::Arc<str>, D::Error> {
    /// Names kept per thread at most: a table of that many names stays small, and
    /// data naming more files still decodes (each name beyond it its own string).
    const MAX_SHARED: usize = 1024;
    thread_local! {
        static DECODED: std::cell::RefCell<std::collections::HashSet<std::sync::Arc<str>>> =
            std::cell::RefCell::new(std::collections::HashSet::new());
    }
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = std::sync::Arc<str>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a file name")
        }
        fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<std::sync::Arc<str>, E> {
            Ok(DECODED.with(|t| {
                let mut t = t.borrow_mut();
                if let Some(shared) = t.get(name) {
                    return shared.clone();
                }
                let shared: std::sync::Arc<str> = name.into();
                if t.len() < MAX_SHARED {
                    t.insert(shared.clone());
                }
                shared
            }))
        }
    }
    d.deserialize_str(V)
}

type Attribution = (&'static str, SourceLoc);

thread_local! {
    static ATTRIBUTIONS: std::cell::RefCell<Vec<Attribution>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// While it lives (on this thread), ops whose call site is in a library's source tree
/// are attributed to another location: library code that runs a user's program on the
/// user's behalf (`aot_module` calling the module's `forward`, a container calling its
/// children, a composed op calling core ops through helpers) names one of its files
/// and the user's line that asked for it, so nodes and errors point at the user's code
/// rather than the library's. Guards nest; the innermost applies first.
#[must_use = "the attribution ends when the guard is dropped"]
pub struct AttributeCalls {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl AttributeCalls {
    /// Attribute calls made from any file in the directory of `file` (give `file!()`),
    /// or below it, to `to`.
    pub fn new(file: &'static str, to: &'static std::panic::Location<'static>) -> AttributeCalls {
        AttributeCalls::to(file, SourceLoc { file: interned(to.file()), line: to.line(), col: to.column() })
    }
    /// Attribute calls made from any file in the directory of `file` (or below it) to
    /// where the innermost active attribution points; `None` when none is active. For
    /// library code reached through `dyn` (a built-in module's `forward`, whose caller
    /// location is its own definition) in another crate than the code that called it on
    /// the user's behalf: it inherits that caller's target.
    pub fn inherit(file: &'static str) -> Option<AttributeCalls> {
        let to = ATTRIBUTIONS.with(|a| a.borrow().last().map(|(_, to)| to.clone()))?;
        Some(AttributeCalls::to(file, to))
    }
    /// [`AttributeCalls::new`] with the target as a [`SourceLoc`].
    pub fn to(file: &'static str, to: SourceLoc) -> AttributeCalls {
        let dir = file.rfind(['/', '\\']).map_or("", |i| &file[..i]);
        ATTRIBUTIONS.with(|a| a.borrow_mut().push((dir, to)));
        AttributeCalls { _not_send: std::marker::PhantomData }
    }
}

impl Drop for AttributeCalls {
    fn drop(&mut self) {
        ATTRIBUTIONS.with(|a| {
            a.borrow_mut().pop();
        });
    }
}

impl fmt::Display for SourceLoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// A graph input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Input {
    /// The value it defines.
    pub id: ValueId,
    /// A readable name (`x`, `arg0`, `l__weight`).
    pub name: String,
    /// Metadata.
    pub meta: TensorMeta,
    /// Its storage; inputs that alias each other share one.
    pub storage: StorageId,
}

/// One op application.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The value it defines.
    pub out: ValueId,
    /// The op.
    pub op: Op,
    /// Arguments, in the op's convention.
    pub args: Vec<ValueId>,
    /// Metadata of the result.
    pub meta: TensorMeta,
    /// Storage of the result (that of `args[0]` for views and mutations).
    pub storage: StorageId,
    /// The user's source line, when known.
    pub loc: Option<SourceLoc>,
}

/// A program: inputs, nodes in execution order, outputs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    /// Inputs, in calling-convention order.
    pub inputs: Vec<Input>,
    /// Nodes, each using only values defined before it.
    pub nodes: Vec<Node>,
    /// Returned values (may repeat, may be inputs).
    pub outputs: Vec<ValueId>,
}

/// What defines a value.
#[derive(Clone, Copy, Debug)]
pub enum Def<'a> {
    /// An input.
    Input(&'a Input),
    /// A node.
    Node(&'a Node),
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }
    /// A lookup table over every value, built once in O(n): O(1) [`GraphIndex::def`],
    /// `meta_of`, `storage_of` and the next free ids, for callers that look up many
    /// values (the methods of the same names on `Graph` scan the graph each time).
    pub fn index(&self) -> GraphIndex<'_> {
        let mut defs = ValueMap::for_graph(self);
        // A repeated id resolves as `def` resolves it: inputs first, then the first node.
        for n in self.nodes.iter().rev() {
            defs.insert(n.out, Def::Node(n));
        }
        for i in self.inputs.iter().rev() {
            defs.insert(i.id, Def::Input(i));
        }
        GraphIndex { defs, next_value: self.next_value(), next_storage: self.next_storage() }
    }
    /// An appender that adds inputs and nodes in O(1) each (the next ids and the
    /// storage of every value are computed once), unlike [`Graph::add_input`] and
    /// [`Graph::add_node`], which scan the graph on every call.
    pub fn appender(&mut self) -> GraphAppender<'_> {
        // Resolved like `storage_of`: inputs first, then the first node defining an id.
        let storage = self
            .nodes
            .iter()
            .rev()
            .map(|n| (n.out, n.storage))
            .chain(self.inputs.iter().rev().map(|i| (i.id, i.storage)))
            .collect();
        let (next_value, next_storage) = (self.next_value(), self.next_storage());
        GraphAppender { graph: self, storage, next_value, next_storage }
    }
    /// A value id one larger than any used so far (O(n): a scan of the graph; see
    /// [`Graph::index`] and [`Graph::appender`]).
    pub fn next_value(&self) -> ValueId {
        let max = self.inputs.iter().map(|i| i.id.0).chain(self.nodes.iter().map(|n| n.out.0)).max();
        ValueId(max.map_or(0, |m| m + 1))
    }
    /// A storage id one larger than any used so far (O(n), like [`Graph::next_value`]).
    pub fn next_storage(&self) -> StorageId {
        let max = self.inputs.iter().map(|i| i.storage.0).chain(self.nodes.iter().map(|n| n.storage.0)).max();
        StorageId(max.map_or(0, |m| m + 1))
    }
    /// Append an input with a fresh value id; returns the id. O(n) per call (it scans
    /// for the next id); [`Graph::appender`] appends in O(1).
    pub fn add_input(&mut self, name: impl Into<String>, meta: TensorMeta, storage: StorageId) -> ValueId {
        self.appender().add_input(name, meta, storage)
    }
    /// Append a node with a fresh value id. The storage is `args[0]`'s when the op
    /// aliases it, else `fresh`. Returns the id. O(n) per call (it scans for the next
    /// id and `args[0]`'s storage); [`Graph::appender`] appends in O(1).
    pub fn add_node(
        &mut self,
        op: Op,
        args: Vec<ValueId>,
        meta: TensorMeta,
        fresh: StorageId,
        loc: Option<SourceLoc>,
    ) -> ValueId {
        self.appender().add_node(op, args, meta, fresh, loc)
    }
    /// What defines `v` (O(n): a scan; [`Graph::index`] answers in O(1)).
    pub fn def(&self, v: ValueId) -> Option<Def<'_>> {
        if let Some(i) = self.inputs.iter().find(|i| i.id == v) {
            return Some(Def::Input(i));
        }
        self.nodes.iter().find(|n| n.out == v).map(Def::Node)
    }
    /// Metadata of `v` (O(n), see [`Graph::def`]).
    pub fn meta_of(&self, v: ValueId) -> Option<&TensorMeta> {
        self.def(v).map(|d| match d {
            Def::Input(i) => &i.meta,
            Def::Node(n) => &n.meta,
        })
    }
    /// Storage of `v` (O(n), see [`Graph::def`]).
    pub fn storage_of(&self, v: ValueId) -> Option<StorageId> {
        self.def(v).map(|d| match d {
            Def::Input(i) => i.storage,
            Def::Node(n) => n.storage,
        })
    }
}

fn def_meta<'a>(d: Def<'a>) -> &'a TensorMeta {
    match d {
        Def::Input(i) => &i.meta,
        Def::Node(n) => &n.meta,
    }
}

fn def_storage(d: Def<'_>) -> StorageId {
    match d {
        Def::Input(i) => i.storage,
        Def::Node(n) => n.storage,
    }
}

/// A map from value ids to `T` for the values of one graph: a table indexed by id for
/// ids up to a bound sized from the graph (value ids are dense in every graph the
/// pipeline builds, and a table lookup is much cheaper than hashing), a hash map for
/// any id beyond it, so sparse ids (a hand-written or parsed graph) cost no memory.
#[derive(Clone, Debug)]
pub struct ValueMap<T> {
    dense: Vec<Option<T>>,
    sparse: HashMap<ValueId, T>,
    len: usize,
}

impl<T> ValueMap<T> {
    /// An empty map whose table covers ids `0..ids`.
    pub fn with_table(ids: usize) -> ValueMap<T> {
        let mut dense = Vec::new();
        dense.resize_with(ids, || None);
        ValueMap { dense, sparse: HashMap::new(), len: 0 }
    }
    /// An empty map sized for the values of `g`: its table covers every id of `g`
    /// when they are dense enough (at most four ids per value), else twice as many
    /// ids as `g` has values.
    pub fn for_graph(g: &Graph) -> ValueMap<T> {
        let count = g.inputs.len() + g.nodes.len();
        let max = g.inputs.iter().map(|i| i.id.0).chain(g.nodes.iter().map(|n| n.out.0)).max().unwrap_or(0) as usize;
        let dense_bound = count.saturating_mul(4).saturating_add(1024);
        ValueMap::with_table(if max < dense_bound { max + 1 } else { count.saturating_mul(2).saturating_add(64) })
    }
    /// Insert, returning the value `v` had.
    pub fn insert(&mut self, v: ValueId, t: T) -> Option<T> {
        let old = match self.dense.get_mut(v.0 as usize) {
            Some(slot) => slot.replace(t),
            None => self.sparse.insert(v, t),
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }
    /// The value of `v`.
    pub fn get(&self, v: &ValueId) -> Option<&T> {
        match self.dense.get(v.0 as usize) {
            Some(slot) => slot.as_ref(),
            None => self.sparse.get(v),
        }
    }
    /// The value of `v`, mutably.
    pub fn get_mut(&mut self, v: &ValueId) -> Option<&mut T> {
        match self.dense.get_mut(v.0 as usize) {
            Some(slot) => slot.as_mut(),
            None => self.sparse.get_mut(v),
        }
    }
    /// Whether `v` has a value.
    pub fn contains_key(&self, v: &ValueId) -> bool {
        self.get(v).is_some()
    }
    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// O(1) lookups over a graph's values (see [`Graph::index`]); it borrows the graph, so
/// it describes the graph as it was when built.
#[derive(Clone, Debug)]
pub struct GraphIndex<'a> {
    defs: ValueMap<Def<'a>>,
    next_value: ValueId,
    next_storage: StorageId,
}

impl<'a> GraphIndex<'a> {
    /// What defines `v` (the same answer as [`Graph::def`]).
    pub fn def(&self, v: ValueId) -> Option<Def<'a>> {
        self.defs.get(&v).copied()
    }
    /// Metadata of `v`.
    pub fn meta_of(&self, v: ValueId) -> Option<&'a TensorMeta> {
        self.def(v).map(def_meta)
    }
    /// Storage of `v`.
    pub fn storage_of(&self, v: ValueId) -> Option<StorageId> {
        self.def(v).map(def_storage)
    }
    /// [`Graph::next_value`] of the indexed graph.
    pub fn next_value(&self) -> ValueId {
        self.next_value
    }
    /// [`Graph::next_storage`] of the indexed graph.
    pub fn next_storage(&self) -> StorageId {
        self.next_storage
    }
}

/// Appends inputs and nodes to a graph in O(1) each (see [`Graph::appender`]); the
/// result is the graph [`Graph::add_input`]/[`Graph::add_node`] would build.
#[derive(Debug)]
pub struct GraphAppender<'a> {
    graph: &'a mut Graph,
    storage: HashMap<ValueId, StorageId>,
    next_value: ValueId,
    next_storage: StorageId,
}

impl GraphAppender<'_> {
    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        self.graph
    }
    /// [`Graph::add_input`] in O(1).
    pub fn add_input(&mut self, name: impl Into<String>, meta: TensorMeta, storage: StorageId) -> ValueId {
        let id = self.fresh_value();
        self.note_storage(storage);
        self.storage.insert(id, storage);
        self.graph.inputs.push(Input { id, name: name.into(), meta, storage });
        id
    }
    /// [`Graph::add_node`] in O(1).
    pub fn add_node(
        &mut self,
        op: Op,
        args: Vec<ValueId>,
        meta: TensorMeta,
        fresh: StorageId,
        loc: Option<SourceLoc>,
    ) -> ValueId {
        let out = self.fresh_value();
        let storage = match op.aliasing() {
            Aliasing::Fresh => fresh,
            _ => args.first().and_then(|a| self.storage.get(a).copied()).unwrap_or(fresh),
        };
        self.note_storage(storage);
        self.storage.insert(out, storage);
        self.graph.nodes.push(Node { out, op, args, meta, storage, loc });
        out
    }
    /// A storage id one larger than any used so far ([`Graph::next_storage`]).
    pub fn next_storage(&self) -> StorageId {
        self.next_storage
    }
    fn fresh_value(&mut self) -> ValueId {
        let id = self.next_value;
        self.next_value = ValueId(id.0 + 1);
        id
    }
    fn note_storage(&mut self, s: StorageId) {
        if s.0 >= self.next_storage.0 {
            self.next_storage = StorageId(s.0 + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::op::UnaryOp;

    #[test]
    fn value_maps_agree_with_a_hash_map_for_dense_and_sparse_ids() {
        let mut g = Graph::new();
        for k in 0..10u32 {
            g.inputs.push(Input {
                id: ValueId(k),
                name: format!("x{k}"),
                meta: TensorMeta::from_sizes(&[2], crate::DType::F32),
                storage: StorageId(k),
            });
        }
        let mut m: ValueMap<u64> = ValueMap::for_graph(&g);
        let mut want: HashMap<ValueId, u64> = HashMap::new();
        // Ids inside the table, far beyond it, and the largest id there is.
        for (i, id) in [0u32, 3, 9, 9, 40, 1_000_000, u32::MAX, 3].into_iter().enumerate() {
            assert_eq!(m.insert(ValueId(id), i as u64), want.insert(ValueId(id), i as u64));
        }
        for id in [0u32, 1, 3, 9, 40, 41, 1_000_000, u32::MAX] {
            assert_eq!(m.get(&ValueId(id)), want.get(&ValueId(id)), "id {id}");
            assert_eq!(m.contains_key(&ValueId(id)), want.contains_key(&ValueId(id)));
        }
        *m.get_mut(&ValueId(u32::MAX)).unwrap() += 1;
        assert_eq!(m.get(&ValueId(u32::MAX)), Some(&7));
        assert_eq!(m.len(), want.len());
    }

    #[test]
    fn index_and_appender_agree_with_the_scanning_methods() {
        let m = TensorMeta::from_sizes(&[2], DType::F32);
        let mut slow = Graph::new();
        let a = slow.add_input("a", m.clone(), StorageId(3));
        let b = slow.add_input("b", m.clone(), StorageId(0));
        let e = slow.add_node(Op::Unary(UnaryOp::Exp), vec![a], m.clone(), StorageId(7), None);
        let v = slow.add_node(Op::Alias, vec![b], m.clone(), StorageId(9), None);
        let mut fast = Graph::new();
        {
            let mut w = fast.appender();
            assert_eq!(w.add_input("a", m.clone(), StorageId(3)), a);
            assert_eq!(w.add_input("b", m.clone(), StorageId(0)), b);
            assert_eq!(w.add_node(Op::Unary(UnaryOp::Exp), vec![a], m.clone(), StorageId(7), None), e);
            assert_eq!(w.next_storage(), StorageId(8));
            assert_eq!(w.add_node(Op::Alias, vec![b], m.clone(), StorageId(9), None), v);
            assert_eq!(w.graph().nodes.len(), 2);
        }
        assert_eq!(fast, slow);
        // The alias took b's storage, not the fresh one offered.
        let idx = slow.index();
        assert_eq!(idx.storage_of(v), Some(StorageId(0)));
        for id in [a, b, e, v] {
            assert_eq!(idx.storage_of(id), slow.storage_of(id));
            assert_eq!(idx.meta_of(id), slow.meta_of(id));
            assert!(
                matches!((idx.def(id), slow.def(id)), (Some(Def::Input(x)), Some(Def::Input(y))) if std::ptr::eq(x, y))
                    || matches!((idx.def(id), slow.def(id)), (Some(Def::Node(x)), Some(Def::Node(y))) if std::ptr::eq(x, y))
            );
        }
        assert!(idx.def(ValueId(99)).is_none());
        assert_eq!((idx.next_value(), idx.next_storage()), (slow.next_value(), slow.next_storage()));
        assert_eq!((idx.next_value(), idx.next_storage()), (ValueId(4), StorageId(8)));
        // Appending to a non-empty graph continues after its ids.
        let mut w = slow.appender();
        let x = w.add_node(Op::Unary(UnaryOp::Neg), vec![v], m, StorageId(8), None);
        assert_eq!(x, ValueId(4));
        assert_eq!(slow.storage_of(x), Some(StorageId(8)));
    }
}

/// Why [`Graph::verify`] rejected a graph: which node (by position; `None` for the
/// inputs or the returned values) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidGraph {
    /// Position of the offending node in [`Graph::nodes`].
    pub node: Option<usize>,
    /// What is wrong.
    pub msg: String,
}

impl Graph {
    /// Check that the graph is a valid program: every value is defined once, before it
    /// is used; returned values are defined; and every node's recorded metadata is what
    /// shape inference gives for its op and arguments (checked where the metadata
    /// involved is concrete: symbolic relations need the trace's shape environment).
    /// Graphs from text or from a file should pass this before anything runs them.
    pub fn verify(&self) -> Result<(), InvalidGraph> {
        let mut metas: HashMap<ValueId, &TensorMeta> = HashMap::new();
        for i in &self.inputs {
            if metas.insert(i.id, &i.meta).is_some() {
                return Err(InvalidGraph { node: None, msg: format!("input %{} is defined twice", i.id.0) });
            }
        }
        for (k, n) in self.nodes.iter().enumerate() {
            let bad = |msg: String| InvalidGraph { node: Some(k), msg };
            let mut args = Vec::with_capacity(n.args.len());
            for a in &n.args {
                match metas.get(a) {
                    Some(m) => args.push(*m),
                    None => {
                        return Err(bad(format!(
                            "%{} ({}) uses %{}, which is not defined before it",
                            n.out.0,
                            n.op.name(),
                            a.0
                        )))
                    }
                }
            }
            if args.iter().all(|m| m.is_concrete()) && n.meta.is_concrete() {
                match crate::infer::infer(&n.op, &args, &mut crate::sym::StaticOracle) {
                    Ok(m) if m == n.meta => {}
                    Ok(m) => {
                        return Err(bad(format!(
                            "%{} ({}) is recorded as {}, but {} gives {m} for its arguments",
                            n.out.0,
                            n.op.name(),
                            n.meta,
                            n.op.name()
                        )))
                    }
                    Err(e) => return Err(bad(format!("%{} ({}): {e}", n.out.0, n.op.name()))),
                }
            }
            if metas.insert(n.out, &n.meta).is_some() {
                return Err(bad(format!("%{} is defined twice", n.out.0)));
            }
        }
        if let Some(o) = self.outputs.iter().find(|o| !metas.contains_key(o)) {
            return Err(InvalidGraph { node: None, msg: format!("the graph returns %{}, which is not defined", o.0) });
        }
        Ok(())
    }
}
