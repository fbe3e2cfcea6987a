"""Calculator example: multiplication questions answered with a calculator tool."""
