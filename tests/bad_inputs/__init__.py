"""Bad inputs, one test each: refused up front with a message naming the field, the value and what to do, or
honoured as a user would expect."""
