/-
The second line of the Lean verdict: a trusted program that judges the environment a REPL pickled after
elaborating a proof, in a process the proof's code never ran in (verifier_pool/lean_audit.py is its peer and
documents the protocol; keep the two in step).

It never elaborates the proof. It reads the pickle's constants (data, never run), replays every one of them
through the kernel on top of the header's imports (lean4checker's `Lean.Environment.replay'`), and reports
facts about the theorem: its kind, whether its type is the one our canonical statement elaborates to here,
and the axioms it depends on. The worker judges the facts.

NOT COMPILED HERE: no Lean toolchain runs on the machines this was written on. It is written against
Lean v4.28.0, lean4checker v4.28.0 and the REPL v4.28.0 (REPL/Snapshots.lean, `CommandSnapshot.pickle`, for
the pickle's layout); the image build compiles it and fails loudly if a name is wrong. Each Lean name used
here, and where the pinned sources define or use it, is in ../PINNED.md (with the ones only a compile tells).

Wire: the REPL's framing. A request is one JSON object followed by a blank line; a reply is one JSON line
followed by a blank line.
  {"hello": "proofstream-audit/1"}  ->  {"hello": "proofstream-audit/1"}
  {"audit": {"header", "statement", "name", "pickle_hex"}}  ->  exactly one of
    {"facts": {"imports_match": b, "kind": s, "type_matches": b, "axioms": [s]}}
    {"pickle_error": s}   the pickle cannot be read (the proof's side wrote it)
    {"replay_error": s}   the kernel refused one of its constants
    {"error": s}          our side failed (the header or the statement did not elaborate here)
-/
import Lean
import Lean4Checker.Replay

open Lean Elab

namespace ProofstreamAudit

def protocol : String := "proofstream-audit/1"

/-- Where the pickle's bytes are written, in this sandbox's own /tmp. -/
def picklePath : System.FilePath := "/tmp/proofstream-audit.olean"

structure AuditRequest where
  header : String
  statement : String
  name : String
  pickle_hex : String
deriving FromJson

/-- Whether a message is an error (matched as the REPL's `Message.of` matches severities, REPL/JSON.lean). -/
def isError (m : Message) : Bool :=
  match m.severity with
  | .error => true
  | _ => false

/-- The first three errors of a message log, as text: `line:column: message`, built from the fields the REPL
reads at the pinned tag (`m.pos`, `m.data.toString`; REPL/JSON.lean, `Message.of`). -/
def errorsOf (log : MessageLog) : IO String := do
  let errors := (log.toList.filter isError).take 3
  let texts ← errors.mapM fun m => do return s!"{m.pos.line}:{m.pos.column}: {← m.data.toString}"
  return "; ".intercalate texts

def hexValue (c : UInt8) : Option UInt8 :=
  if 48 ≤ c && c ≤ 57 then some (c - 48)
  else if 97 ≤ c && c ≤ 102 then some (c - 87)
  else none

def decodeHex (s : String) : Except String ByteArray := do
  let b := s.toUTF8
  if b.size % 2 != 0 then throw "odd number of hex digits"
  let mut out := ByteArray.empty
  for i in [0:b.size / 2] do
    let some hi := hexValue b[2 * i]! | throw "not lowercase hex"
    let some lo := hexValue b[2 * i + 1]! | throw "not lowercase hex"
    out := out.push (hi * 16 + lo)
  return out

/-- The header's environment and the canonical statement's universe parameters and type, elaborated here
from our own text (the statement with `sorry` for its proof: only its type is used). -/
def canonical (header statement : String) (name : Name) :
    IO (Except String (Environment × List Name × Expr)) := do
  let input := header ++ "\n\n" ++ statement ++ " sorry\n"
  let inputCtx := Parser.mkInputContext input "<canonical statement>"
  let (hdr, parserState, messages) ← Parser.parseHeader inputCtx
  let (headerEnv, messages) ← processHeader hdr {} messages inputCtx
  if messages.hasErrors then
    return .error s!"the header did not elaborate: {← errorsOf messages}"
  let s ← IO.processCommands inputCtx parserState (Command.mkState headerEnv messages {})
  let cmd := s.commandState
  if cmd.messages.hasErrors then
    return .error s!"the canonical statement did not elaborate: {← errorsOf cmd.messages}"
  match cmd.env.find? name with
  | some ci => return .ok (headerEnv, ci.levelParams, ci.type)
  | none => return .error s!"the canonical statement does not declare {name}"

/-- The least monad `collectAxioms` runs in (its worker, `CollectAxioms.collect`, is private in recent Lean). -/
abbrev EnvM := StateM Environment

instance : MonadEnv EnvM where
  getEnv := get
  modifyEnv f := modify f

def kindOf : Option ConstantInfo → String
  | some (.thmInfo _) => "theorem"
  | some (.axiomInfo _) => "axiom"
  | some (.defnInfo _) => "definition"
  | some (.opaqueInfo _) => "opaque"
  | some _ => "other"
  | none => "missing"

/-- An audit that ends early: the reply's key (`pickle_error`, `replay_error`, `error`) and its text. -/
abbrev AuditM := ExceptT (String × String) IO

def orFail {α : Type} (key : String) : Except String α → AuditM α
  | .ok a => pure a
  | .error e => throw (key, e)

/-- `x`'s result, or its IO error as text (caught in IO, as the REPL's `runProofStep` catches). -/
def attempt {α : Type} (x : IO α) : IO (Except String α) := do
  try
    return .ok (← x)
  catch e =>
    return .error (toString e)

def orFailIO {α : Type} (key : String) (x : IO α) : AuditM α := do
  orFail key (← attempt x)

/-- One audit. The pickle is the REPL's `CommandSnapshot.pickle`: `(imports, map₂, cmdState, cmdContext)`,
nested pairs; only the first two are read, the rest is never touched. -/
unsafe def audit (req : AuditRequest) : AuditM Json := do
  let some name := Syntax.decodeNameLit ("`" ++ req.name) | throw ("error", s!"not a name: {req.name}")
  let name := name.replacePrefix `_root_ .anonymous
  let bytes ← orFail "error" (decodeHex req.pickle_hex)
  let (headerEnv, levels, type) ← orFail "error" (← canonical req.header req.statement name)
  IO.FS.writeBinFile picklePath bytes
  -- The region is never freed: one audit per process (the worker kills the sandbox after it).
  let (data, _region) ← orFailIO "pickle_error" (readModuleData picklePath)
  let (imports, map₂, _) : Array Import × PHashMap Name ConstantInfo × NonScalar := unsafeCast data
  let importsMatch := imports.map (·.module) == headerEnv.header.imports.map (·.module)
  let env ← orFailIO "replay_error" (headerEnv.replay' (Std.HashMap.ofList map₂.toList))
  let ci := env.find? name
  let typeMatches := match ci with
    | some ci => ci.levelParams == levels && ci.type == type
    | none => false
  let (axioms, _) := (collectAxioms name : EnvM (Array Name)).run env
  return Json.mkObj [("facts", Json.mkObj [
    ("imports_match", toJson importsMatch),
    ("kind", toJson (kindOf ci)),
    ("type_matches", toJson typeMatches),
    ("axioms", toJson (axioms.map toString))])]

/-- The lines up to the first blank one, as the REPL reads a query; "" at end of input. -/
partial def readQuery (stdin : IO.FS.Stream) (acc : String := "") : IO String := do
  let line ← stdin.getLine
  if line.trimAscii.isEmpty then return acc  -- `String.trim` is deprecated since v4.27 (the REPL's getLines)
  readQuery stdin (acc ++ line)

unsafe def answer (query : String) : IO Json := do
  let .ok json := Json.parse query | return Json.mkObj [("error", "request is not JSON")]
  if let .ok (hello : String) := json.getObjValAs? String "hello" then
    return Json.mkObj [("hello", if hello == protocol then protocol else s!"unknown protocol {hello}")]
  match json.getObjValAs? AuditRequest "audit" with
  | .error e => return Json.mkObj [("error", s!"not an audit request: {e}")]
  | .ok req =>
    match ← (audit req).run with
    | .ok facts => return facts
    | .error (key, text) => return Json.mkObj [(key, text)]

unsafe def loop (stdin stdout : IO.FS.Stream) : IO Unit := do
  let query ← readQuery stdin
  if query.isEmpty then return
  let reply ← try answer query catch e => pure (Json.mkObj [("error", toString e)])
  stdout.putStr (reply.compress ++ "\n\n")
  stdout.flush
  loop stdin stdout

end ProofstreamAudit

unsafe def main : IO Unit := do
  initSearchPath (← findSysroot)
  enableInitializersExecution  -- Mathlib's elaborators, for our statement; the pickle's code never runs
  ProofstreamAudit.loop (← IO.getStdin) (← IO.getStdout)
