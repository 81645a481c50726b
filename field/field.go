// Package field reports configuration values that cannot work, by the Go
// field that holds them: a package validating its Config names the field
// ("BatchBytes", "Sink.TLS.CAFile") and what to change, never a config key or
// a flag. A program that reads its settings from somewhere else (a file,
// flags) maps the field back to its own name for the user: Error.Text takes
// that mapping.
//
// Validations collect every problem at once (errors.Join of *Error), so that
// one round of edits fixes them all.
package field

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ErrRequired is wrapped by the *Error of a field that must be set and is not.
var ErrRequired = errors.New("required")

// Error reports a field whose value cannot work.
type Error struct {
	// Field is the field's path from the Config validated: "BatchBytes",
	// "Sink.TLS.CAFile".
	Field string
	// Reason says what is wrong and how to fix it. Other fields of the same
	// Config appear in braces ({HistoryInterval}) so that Text can name them
	// as the user knows them.
	Reason string
	// Err, when set, is a condition callers test with errors.Is (ErrRequired).
	Err error
}

func (e *Error) Error() string { return e.Field + ": " + e.Text(nil) }

func (e *Error) Unwrap() error { return e.Err }

// ref matches a {Field} reference, also to a field of a list's element
// ({Tables[0].Router.Topic}).
var ref = regexp.MustCompile(`\{([A-Z][A-Za-z0-9.]*(?:\[[0-9]+\][A-Za-z0-9.]*)*)\}`)

// Text is Reason with every {Field} reference replaced by name(Field), or by
// the field's path when name is nil.
// A brace after \p or \P is a regex's Unicode property (\p{Alpha} in a
// quoted topic regex), not a reference, and is left as it is.
func (e *Error) Text(name func(field string) string) string {
	var b strings.Builder
	last := 0
	for _, m := range ref.FindAllStringIndex(e.Reason, -1) {
		if i := m[0]; i >= 2 && (e.Reason[i-1] == 'p' || e.Reason[i-1] == 'P') && e.Reason[i-2] == '\\' {
			continue
		}
		b.WriteString(e.Reason[last:m[0]])
		f := e.Reason[m[0]+1 : m[1]-1]
		if name == nil {
			b.WriteString(f)
		} else {
			b.WriteString(name(f))
		}
		last = m[1]
	}
	b.WriteString(e.Reason[last:])
	return b.String()
}

// Errorf returns an *Error for field; format's {Field} references name other
// fields of the same Config.
func Errorf(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Required returns the *Error of a required field left empty.
func Required(field, what string) *Error {
	return &Error{Field: field, Reason: "empty: " + what, Err: ErrRequired}
}

// Within returns err with every *Error in it (alone or joined) moved under
// prefix, the field that holds the Config validated: Within("Sink", err)
// turns BatchBytes into Sink.BatchBytes. Other errors pass unchanged.
func Within(prefix string, err error) error {
	if err == nil {
		return nil
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range joined.Unwrap() {
			errs = append(errs, Within(prefix, e))
		}
		return errors.Join(errs...)
	}
	var fe *Error
	if !errors.As(err, &fe) {
		return err
	}
	return &Error{
		Field:  prefix + "." + fe.Field,
		Reason: ref.ReplaceAllString(fe.Reason, "{"+prefix+".$1}"),
		Err:    fe.Err,
	}
}

// All returns every *Error in err's tree (alone, wrapped or joined) and the
// errors that hold none (of a wrapper that holds some, the inner ones).
func All(err error) (fields []*Error, others []error) {
	switch e := err.(type) {
	case nil:
		return nil, nil
	case *Error:
		return []*Error{e}, nil
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			f, o := All(x)
			fields, others = append(fields, f...), append(others, o...)
		}
		return fields, others
	case interface{ Unwrap() error }:
		if f, o := All(e.Unwrap()); len(f) > 0 {
			return f, o
		}
	}
	return nil, []error{err}
}

// A Checker collects the problems of one Config and fills its defaults.
// The zero value is ready to use.
type Checker struct{ errs []error }

// Add records a problem (nil is ignored).
func (c *Checker) Add(err error) {
	if err != nil {
		c.errs = append(c.errs, err)
	}
}

// Errorf records a problem of field.
func (c *Checker) Errorf(field, format string, args ...any) { c.Add(Errorf(field, format, args...)) }

// Err returns every problem recorded, joined, or nil.
func (c *Checker) Err() error { return errors.Join(c.errs...) }

// Default sets *v to def when it is the zero value.
func Default[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Positive sets *v to def when zero and reports a negative value of field.
func Positive[T ~int | ~int64](c *Checker, field string, v *T, def T) {
	switch {
	case *v == 0:
		*v = def
	case *v < 0:
		c.Errorf(field, "%v is negative; use a positive value such as %v, or leave it unset for the default", *v, def)
	}
}

// OneOf reports a value of field that is not one of allowed; the empty value
// takes def.
func OneOf[T ~string](c *Checker, field string, v *T, def T, allowed ...T) {
	Default(v, def)
	for _, a := range allowed {
		if *v == a {
			return
		}
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	c.Errorf(field, "%q is not one of %s", string(*v), strings.Join(names, ", "))
}
