#include <stdio.h>
int main(void) { puts("fleetgate " FLEETGATE_VERSION); return 0; }
