//! Python stacks, read from the calling thread's own frames (issue 3).

use cudaleak_core::python::PyRawFrame;
use std::mem::MaybeUninit;

pub fn init(_enabled: bool) {}

pub fn capture(_out: &mut [MaybeUninit<PyRawFrame>]) -> usize {
    0
}

pub fn remember_code_objects(_frames: &[PyRawFrame]) {}

pub fn status() -> Option<String> {
    None
}
