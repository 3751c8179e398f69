//! The runtime entry point hooked for what it does itself (case 1):
//! cudaDeviceReset, whose teardown the driver hook it calls may not see.

use super::*;

pub struct RuntimeReset;

impl Event for RuntimeReset {
    type State = ();
    fn before(&self, cx: &mut HookCx) -> Option<()> {
        cx.publish(RuntimeCall::new(crate::cuda::hook_table::RUNTIME_DEVICE_RESET));
        Some(())
    }
    fn after(&self, cx: &mut HookCx, _: (), result: c_int) {
        cx.unpublish();
        if result == CUDA_SUCCESS && !cx.runtime.as_ref().is_some_and(|rc| rc.torn_down.get()) {
            tracker::teardown_current_device(cx.thread);
        }
    }
}
