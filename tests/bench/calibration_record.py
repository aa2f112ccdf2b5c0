"""A calibration record of round numbers, for the projection's tests (bench/calibration.py
writes the real ones)."""

RECORD = {
    "date": "2026-11-28 09:00 UTC",
    "machine": "x86_64, 2 cores",
    "load_average": 1.0,
    "elements": 1 << 20,
    "reps": 3,
    "targets": {
        "refswitch": {
            "wall_per_packet_s": 80e-6,
            "worker_cpu_s": 30e-6,
            "worker_user_s": 20e-6,
            "switch_process_s": 50e-6,
            "bpf_program_s": 0.0,
            "rtt_s": 200e-6,
            "worker_cpu_threads_s": 36e-6,  # 4 threads: +20%, 6.7% a thread more
            "threads": 4,
        }
    },
    "gloo": {
        "alpha_s": 50e-6,
        "call_s": 100e-6,
        "step_cpu_s": 20e-6,
        "call_cpu_s": 100e-6,
        "peer_byte_s": 1e-9,
        "peer_cpu_byte_s": 0.5e-9,
    },
    # a routed frame through the reference switch: 10 us, and 10 ns a byte beyond 64
    "forwarding": {
        "refswitch": {
            "forward_small_s": 10e-6,
            "forward_frame_s": 10e-6 + 1450 * 10e-9,
            "forward_byte_s": 10e-9,
            "forward_wall_s": 40e-6,
            "forward_lost": 0.0,
            "forward_latency_s": 30e-6,
        }
    },
    "share": 1.0,  # calibrated on an idle machine
}
