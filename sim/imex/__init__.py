"""Stand-ins for NVIDIA's IMEX daemon (`nvidia-imex`) and its control tool (`nvidia-imex-ctl`), installed into a
simulated node's driver root (sim.runtime.driverinstall) where the real binaries live on a GB200 node.

They read the same files the real ones do (the daemon config, `KEY=VALUE`, and the nodes config it names, one
peer IP per line), talk TCP to their peers on SERVER_PORT (a simulated node has its own loopback address), and
report READY only once every peer named in the nodes config answers: a domain whose daemons were told about a
node that is not up never becomes ready.
"""
