package main

import (
	"flag"
	"fmt"
)

// repeatable marks a flag that takes a value each time it is given
// (--metadata a=1 --metadata b=2); parseFlags lets it repeat.
type repeatable interface{ repeatable() }

// parseFlags is fs.Parse, refusing a flag that takes one value when it is
// given twice (--amount 5 --amount 7): the flag package keeps the last
// value and says nothing, where the API refuses a field given twice and a
// payment must not mean two things. Every command parses its flags here.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(repeatable); !ok {
			f.Value = &onceValue{Value: f.Value, name: f.Name}
		}
	})
	// The flags are unwrapped again before the usage is printed (the flag
	// package reads each value's type to name it and tell its zero) and
	// when parsing ends.
	unwrap := func() {
		fs.VisitAll(func(f *flag.Flag) {
			if o, ok := f.Value.(*onceValue); ok {
				f.Value = o.Value
			}
		})
	}
	defer unwrap()
	usage := fs.Usage
	fs.Usage = func() {
		unwrap()
		usage()
	}
	return fs.Parse(args)
}

// onceValue is a flag's value that takes one Set.
type onceValue struct {
	flag.Value
	name string
	set  bool
}

func (o *onceValue) Set(s string) error {
	if o.set {
		return fmt.Errorf("--%s is given more than once: give it once", o.name)
	}
	o.set = true
	return o.Value.Set(s)
}

// IsBoolFlag keeps a boolean flag one that needs no value (--register).
func (o *onceValue) IsBoolFlag() bool {
	b, ok := o.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
