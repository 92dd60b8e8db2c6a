//! Fuzzing the plugin loader with seeded generators (the convention of
//! `sonde_tests::seeded`): random bytes, generated core modules (a small
//! typed generator over `wasm-encoder`), components wrapping them, mutated
//! real components: a typed error or a plugin that runs, never a panic.

use crate::support::engine;
use sonde_tests::guests;
use sonde_tests::seeded::{self, Case, bytes, plugin_body};

/// The cases of `target` ([`sonde_tests::seeded`]).
fn cases(target: &'static str, default: u64) -> impl Iterator<Item = (Case, fastrand::Rng)> {
    seeded::cases("fuzz", target, default)
}

/// A component that embeds `module` and instantiates it (a valid component
/// whenever the module is valid and imports nothing), exporting nothing.
fn component_around(module: &[u8]) -> Vec<u8> {
    use wasm_encoder::{Component, ComponentSectionId, InstanceSection, RawSection};
    let mut c = Component::new();
    c.section(&RawSection {
        id: ComponentSectionId::CoreModule as u8,
        data: module,
    });
    let mut instances = InstanceSection::new();
    instances.instantiate(0, Vec::<(&str, wasm_encoder::ModuleArg)>::new());
    c.section(&instances);
    c.finish()
}

/// Writes an `i32` expression: constants, locals, arithmetic (which may
/// divide by zero), loads (which may be out of bounds), calls (which may
/// recurse without end), `memory.grow`.
fn expr(rng: &mut fastrand::Rng, f: &mut wasm_encoder::Function, funcs: u32, depth: u32) {
    use wasm_encoder::{Instruction as I, MemArg, MemArgTarget};
    let mem = |rng: &mut fastrand::Rng| MemArg {
        offset: u64::from(rng.u32(..1 << 17)),
        align: rng.u32(..3),
        target: MemArgTarget::Memory(0),
        ordering: None,
    };
    match if depth == 0 { rng.u8(..2) } else { rng.u8(..8) } {
        0 => {
            f.instruction(&I::I32Const(rng.i32(..)));
        }
        1 => {
            f.instruction(&I::LocalGet(rng.u32(..3)));
        }
        2 | 3 => {
            expr(rng, f, funcs, depth - 1);
            expr(rng, f, funcs, depth - 1);
            let ops = [
                I::I32Add,
                I::I32Sub,
                I::I32Mul,
                I::I32DivU,
                I::I32RemS,
                I::I32And,
                I::I32Shl,
                I::I32Xor,
            ];
            f.instruction(&ops[rng.usize(..ops.len())]);
        }
        4 => {
            expr(rng, f, funcs, depth - 1);
            f.instruction(&I::I32Load(mem(rng)));
        }
        5 if funcs > 1 => {
            expr(rng, f, funcs, depth - 1);
            f.instruction(&I::Call(rng.u32(1..funcs)));
        }
        6 => {
            expr(rng, f, funcs, depth - 1);
            f.instruction(&I::MemoryGrow(0));
        }
        _ => {
            f.instruction(&I::MemorySize(0));
        }
    }
}

/// Writes statements that leave the stack as they found it: stores, local
/// sets, blocks, loops (which may never end), ifs, traps.
fn statements(rng: &mut fastrand::Rng, f: &mut wasm_encoder::Function, funcs: u32, depth: u32) {
    use wasm_encoder::{BlockType, Instruction as I, MemArg, MemArgTarget};
    for _ in 0..rng.u32(..6) {
        match if depth == 0 { rng.u8(..2) } else { rng.u8(..7) } {
            0 => {
                expr(rng, f, funcs, 3);
                f.instruction(&I::LocalSet(rng.u32(..3)));
            }
            1 => {
                expr(rng, f, funcs, 2);
                expr(rng, f, funcs, 2);
                f.instruction(&I::I32Store(MemArg {
                    offset: u64::from(rng.u32(..1 << 17)),
                    align: 2,
                    target: MemArgTarget::Memory(0),
                    ordering: None,
                }));
            }
            2 => {
                f.instruction(&I::Loop(BlockType::Empty));
                statements(rng, f, funcs, depth - 1);
                expr(rng, f, funcs, 2);
                f.instruction(&I::BrIf(0));
                f.instruction(&I::End);
            }
            3 => {
                f.instruction(&I::Block(BlockType::Empty));
                statements(rng, f, funcs, depth - 1);
                expr(rng, f, funcs, 2);
                f.instruction(&I::BrIf(0));
                statements(rng, f, funcs, depth - 1);
                f.instruction(&I::End);
            }
            4 | 5 => {
                expr(rng, f, funcs, 2);
                f.instruction(&I::If(BlockType::Empty));
                statements(rng, f, funcs, depth - 1);
                f.instruction(&I::Else);
                statements(rng, f, funcs, depth - 1);
                f.instruction(&I::End);
            }
            _ => {
                f.instruction(&I::Unreachable);
            }
        }
    }
}

/// A valid core module from a small typed generator: a memory, functions
/// of random well-typed code, an exported entry point and sometimes a
/// start function. What it does when run is anyone's guess: trap, loop,
/// recurse, grow memory.
fn generated_module(rng: &mut fastrand::Rng) -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, ExportKind, ExportSection, Function, FunctionSection, Instruction, MemorySection, MemoryType,
        Module, StartSection, TypeSection, ValType,
    };
    let funcs = rng.u32(1..6);
    let mut m = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([], []);
    types.ty().function([ValType::I32], [ValType::I32]);
    m.section(&types);
    let mut functions = FunctionSection::new();
    for i in 0..funcs {
        functions.function(u32::from(i != 0));
    }
    m.section(&functions);
    let mut memories = MemorySection::new();
    let minimum = rng.u64(..4);
    memories.memory(MemoryType {
        minimum,
        maximum: rng.bool().then(|| rng.u64(minimum..=1 << 16)),
        memory64: false,
        shared: false,
        page_size_log2: None,
    });
    m.section(&memories);
    let mut exports = ExportSection::new();
    exports.export("memory", ExportKind::Memory, 0);
    exports.export("run", ExportKind::Func, 0);
    m.section(&exports);
    if rng.bool() {
        m.section(&StartSection { function_index: 0 });
    }
    let mut code = CodeSection::new();
    for i in 0..funcs {
        // Locals 0..3 are i32s (the parameter, if any, is local 0).
        let mut f = Function::new([(if i == 0 { 3 } else { 2 }, ValType::I32)]);
        statements(rng, &mut f, funcs, 3);
        if i != 0 {
            expr(rng, &mut f, funcs, 3);
        }
        f.instruction(&Instruction::End);
        code.function(&f);
    }
    m.section(&code);
    m.finish()
}

#[test]
fn generated_modules_are_valid_wasm() {
    // The generator is only useful if what it makes gets past validation
    // and into the compiler.
    for (_case, mut rng) in cases("generated_modules_are_valid_wasm", 200) {
        let bytes = generated_module(&mut rng);
        wasmtime::Module::validate(&wasmtime::Engine::default(), &bytes)
            .unwrap_or_else(|e| panic!("an invalid generated module: {e:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_loader_refuses_or_runs_whatever_it_is_given() {
    let good = std::fs::read(guests::ALWAYS_UP).unwrap();
    let (mut loaded, mut refused) = (0, 0);
    for (_case, mut rng) in cases("the_plugin_loader_refuses_or_runs_whatever_it_is_given", 200) {
        let bytes = match rng.u8(..5) {
            0 => bytes(&mut rng, 2048),
            1 => generated_module(&mut rng),
            2 => component_around(&generated_module(&mut rng)),
            _ => plugin_body(&mut rng, &good),
        };
        match engine().load("fuzzed", &bytes).await {
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
            Ok(plugin) => {
                loaded += 1;
                // Whatever loads runs to a verdict under its limits.
                let limits = sonde_sandbox::engine::Limits {
                    timeout: std::time::Duration::from_millis(500),
                    ..sonde_sandbox::engine::Limits::default()
                };
                let result = crate::support::run_with_limits(&plugin, limits).await;
                assert!(!result.message.contains("panicked"), "{}", result.message);
            }
        }
    }
    eprintln!("plugin loader: {loaded} loaded, {refused} refused");
}
