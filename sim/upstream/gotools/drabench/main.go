// drabench drives kube-scheduler's DRA allocator (k8s.io/dynamic-resource-allocation/structured, the code its
// dynamicresources plugin calls) directly on the objects `gpu-dra bench allocate --kubernetes upstream` sends on
// stdin (or in the file named by its one argument), as that plugin does for each pod: PreFilter builds an allocator
// over every slice and the devices already allocated, Filter calls Allocate for the pod's claims on a node. Each
// step names the node to try (the one our placer chose) or none: then the nodes are tried in name order and the
// first that fits takes the claim. What was allocated is committed to the allocated state before the next step, as
// the scheduler's assume cache does. Prints the results, the Allocate calls and the process CPU time (getrusage)
// and wall time of the steps as JSON.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type input struct {
	Features structured.Features          `json:"features"`
	Classes  []*resourceapi.DeviceClass   `json:"classes"`
	Slices   []*resourceapi.ResourceSlice `json:"slices"`
	Steps    []step                       `json:"steps"`
}

type step struct {
	Claim *resourceapi.ResourceClaim `json:"claim"`
	Node  string                     `json:"node"` // "": try every node
}

type result struct {
	Node    string   `json:"node,omitempty"`
	Devices []string `json:"devices"` // pool/device, in result order
	Error   string   `json:"error,omitempty"`
}

type output struct {
	Results         []result `json:"results"`
	CPUSeconds      float64  `json:"cpuSeconds"`
	WallSeconds     float64  `json:"wallSeconds"`
	NewAllocatorCPU float64  `json:"newAllocatorCpuSeconds"`
	AllocateCalls   int      `json:"allocateCalls"` // Filter calls: one per node tried
	Allocator       string   `json:"allocatorFeatures"`
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, class := range c {
		out = append(out, class)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if class, ok := c[name]; ok {
		return class, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		panic(err)
	}
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

func main() {
	source, name := os.Stdin, "stdin"
	switch {
	case len(os.Args) > 2:
		fmt.Fprintln(os.Stderr, "usage: drabench [FILE] (the objects as JSON; without FILE or with -, from stdin)")
		os.Exit(2)
	case len(os.Args) == 2 && os.Args[1] != "-":
		file, err := os.Open(os.Args[1])
		if err != nil {
			fmt.Fprintf(os.Stderr, "drabench: %v\n", err)
			os.Exit(2)
		}
		defer file.Close()
		source, name = file, os.Args[1]
	}
	var in input
	if err := json.NewDecoder(source).Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "drabench: reading the objects from %s: %v\n", name, err)
		os.Exit(2)
	}
	lister := classes{}
	for _, class := range in.Classes {
		lister[class.Name] = class
	}
	nodeSet := sets.New[string]()
	for _, slice := range in.Slices {
		if slice.Spec.NodeName != nil {
			nodeSet.Insert(*slice.Spec.NodeName)
		}
	}
	nodes := map[string]*v1.Node{}
	names := sets.List(nodeSet)
	sort.Strings(names)
	for _, name := range names {
		nodes[name] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	// As kube-scheduler's plugin makes its cache (the 10 most recent expressions).
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: in.Features.ConsumableCapacity,
		EnableListTypeAttributes: in.Features.ListTypeAttributes})
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}
	ctx := context.Background()
	out := output{Results: make([]result, 0, len(in.Steps)), Allocator: fmt.Sprint(sets.List(in.Features.Set()))}
	wall := time.Now()
	cpu := cpuSeconds()
	for _, s := range in.Steps {
		before := cpuSeconds()
		allocator, err := structured.NewAllocator(ctx, in.Features, state, lister, in.Slices, cache)
		out.NewAllocatorCPU += cpuSeconds() - before
		if err != nil {
			fmt.Fprintf(os.Stderr, "drabench: %v\n", err)
			os.Exit(1)
		}
		candidates := names
		if s.Node != "" {
			candidates = []string{s.Node}
		}
		r := result{Devices: []string{}}
		for _, name := range candidates {
			node, ok := nodes[name]
			if !ok {
				node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
			}
			out.AllocateCalls++
			allocations, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{s.Claim})
			if err != nil {
				r.Error = err.Error()
				continue
			}
			if len(allocations) == 0 {
				r.Error = "no allocation on this node"
				continue
			}
			r = result{Node: name, Devices: []string{}}
			for _, d := range allocations[0].Devices.Results {
				r.Devices = append(r.Devices, d.Pool+"/"+d.Device)
				state.AllocatedDevices.Insert(structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
			}
			break
		}
		out.Results = append(out.Results, r)
	}
	out.CPUSeconds = cpuSeconds() - cpu
	out.WallSeconds = time.Since(wall).Seconds()
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "drabench: %v\n", err)
		os.Exit(1)
	}
}
