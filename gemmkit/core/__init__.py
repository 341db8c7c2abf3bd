"""Host-side machinery shared by all ops: devices, configs, validation, launches."""
