"""The kubelet, simulated: its DRA side (`dra`), its device manager (`devicemanager`) and its pod workers (`pods`)."""
