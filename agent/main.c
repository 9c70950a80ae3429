#include <stdio.h>
int main(void) { puts("fleetgate-agent " FLEETGATE_VERSION); return 0; }
